"""The worker check's probe: what it imports, and how it reports the first failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flinkish import worker_python
from flinkish.worker_python import TASK_MODULES, worker_probe


def test_the_probe_names_the_first_module_that_fails_to_import() -> None:
    python, error, files = worker_probe(("json", "flinkish_no_such_module", "also_missing"))()
    assert python == sys.executable and files == []
    assert error == ("flinkish_no_such_module: ModuleNotFoundError: "
                     "No module named 'flinkish_no_such_module'")


def test_the_probe_imports_what_read_and_write_tasks_need() -> None:
    assert {"pyarrow", "confluent_kafka", "flinkish.data_source"} <= set(TASK_MODULES)
    python, error, files = worker_probe(TASK_MODULES)()
    assert (python, error) == (sys.executable, None)
    # the files the imports came from, which a later driver checks are unchanged
    assert {Path(p).name for p, _, _ in files} >= {"__init__.py", "stream_writer.py"}
    assert all(os.stat(p).st_size == size for p, _, size in files)


def test_a_module_imported_from_a_zip_is_stamped_by_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As pyspark is in a worker that Spark started with pyspark.zip on its path."""
    import zipfile

    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("flinkish_zipped_probe/__init__.py", "x = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "flinkish_zipped_probe", raising=False)
    python, error, files = worker_probe(("flinkish_zipped_probe",))()
    assert error is None
    assert files[0] == (str(archive), archive.stat().st_mtime_ns, archive.stat().st_size)


class FakeContext:
    master = "local[2]"
    pythonExec = sys.executable
    environment: dict[str, str] = {}
    version = "4.x"


class FakeSession:
    sparkContext = FakeContext()


def test_a_local_masters_success_is_remembered_while_its_files_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_python.tempfile, "gettempdir", lambda: str(tmp_path))
    key = worker_python._remembered_key(FakeSession())
    assert key is not None and not worker_python._known_good(key)
    module = tmp_path / "mod.py"
    module.write_text("x = 1\n")
    stat = module.stat()
    worker_python._remember(key, [(str(module), stat.st_mtime_ns, stat.st_size)])
    assert worker_python._known_good(key)
    module.write_text("x = 22\n")  # reinstalled, changed: ask the workers again
    assert not worker_python._known_good(key)
    module.unlink()  # uninstalled
    assert not worker_python._known_good(key)


def test_what_decides_the_workers_answer_is_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = worker_python._remembered_key(FakeSession())
    monkeypatch.chdir(tmp_path)  # the working directory comes first on their sys.path
    assert worker_python._remembered_key(FakeSession()) != key
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    moved = worker_python._remembered_key(FakeSession())
    assert moved not in (key, None)
    monkeypatch.setattr(FakeContext, "master", "spark://host:7077")  # executors elsewhere
    assert worker_python._remembered_key(FakeSession()) is None


def test_a_virtualenvs_interpreter_and_its_base_have_keys_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A virtualenv's ``bin/python3`` is a link to its base interpreter: the same file, not the
    same packages (a base interpreter without pyarrow must not inherit the virtualenv's
    success)."""
    base = os.path.realpath(sys.executable)
    link = tmp_path / "venv" / "bin" / "python3"
    link.parent.mkdir(parents=True)
    link.symlink_to(base)
    monkeypatch.setattr(FakeContext, "pythonExec", base)
    from_base = worker_python._remembered_key(FakeSession())
    monkeypatch.setattr(FakeContext, "pythonExec", str(link))
    assert worker_python._remembered_key(FakeSession()) not in (from_base, None)
