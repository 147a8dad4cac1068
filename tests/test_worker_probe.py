"""The worker check's probe: what it imports, and how it reports the first failure."""

from __future__ import annotations

import sys

from flinkish.worker_python import TASK_MODULES, worker_probe


def test_the_probe_names_the_first_module_that_fails_to_import() -> None:
    python, error = worker_probe(("json", "flinkish_no_such_module", "also_missing"))()
    assert python == sys.executable
    assert error == ("flinkish_no_such_module: ModuleNotFoundError: "
                     "No module named 'flinkish_no_such_module'")


def test_the_probe_imports_what_read_and_write_tasks_need() -> None:
    assert {"pyarrow", "confluent_kafka", "flinkish.data_source"} <= set(TASK_MODULES)
    assert worker_probe(TASK_MODULES)() == (sys.executable, None)
