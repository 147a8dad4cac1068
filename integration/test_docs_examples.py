"""Every example of the README and the docs site runs as a reader runs it: each page's text as
written, against the ``flinkish dev`` the page starts, with only the environment that
``flinkish dev`` exports (``FLINKISH_KAFKA_BOOTSTRAP``, ``FLINKISH_POSTGRES_DSN``), and a page's
output blocks must match what its examples print (``integration/run_doc_pages.py``). The pages
run one after another in one driver process of their own, in a fresh directory. How blocks are
marked: ``integration/doc_examples.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integration.doc_examples import DEV_ENV, ROOT, runnable_pages

pytestmark = pytest.mark.integration

PAGES = runnable_pages()
#: For every page together (a page takes seconds to a minute).
TIMEOUT_S = 900
STOP_S = 60


@pytest.fixture(scope="module")
def page_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each page's result: ``error`` (None when it ran and printed what it shows), ``seconds``."""
    workdir = tmp_path_factory.mktemp("reader")
    results = workdir / "results.json"
    env = {key: value for key, value in os.environ.items() if key not in DEV_ENV}
    # the reader's virtualenv is active; the pages show commands' output at 100 columns
    env |= {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "100",
            "PYTHONPATH": str(ROOT)}
    # a session of its own: on a timeout its flinkish dev servers stop with it
    reader = subprocess.Popen([sys.executable, "-m", "integration.run_doc_pages", str(results),
                               *map(str, PAGES)], cwd=workdir, env=env, start_new_session=True)
    try:
        assert reader.wait(TIMEOUT_S) == 0
    finally:
        if reader.poll() is None:
            os.killpg(reader.pid, signal.SIGTERM)  # flinkish dev stops its servers on SIGTERM
            try:
                reader.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(reader.pid, signal.SIGKILL)
                reader.wait()
    found: dict[str, Any] = json.loads(results.read_text())
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_examples_run_as_written_and_print_what_the_page_shows(
    page: Path, page_results: dict[str, Any],
) -> None:
    result = page_results.get(str(page))
    assert result is not None, f"{page} did not run"
    assert result["error"] is None, result["error"]
