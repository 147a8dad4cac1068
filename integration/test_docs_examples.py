"""Every example of the README and the docs site runs, against the session's broker, Spark and
PostgreSQL, with the values ``flinkish dev`` exports (``FLINKISH_KAFKA_BOOTSTRAP``,
``FLINKISH_POSTGRES_DSN``); a page's output blocks must match what its examples print. How
blocks are marked: ``integration/doc_examples.py``."""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flinkish.demo.embedded_kafka import EXTERNAL_ENV, create_topic
from flinkish.demo.embedded_postgres import DSN_ENV
from integration.doc_examples import (
    ILLUSTRATIONS,
    ROOT,
    RUNNABLE,
    Block,
    blocks,
    runnable_pages,
)

pytestmark = pytest.mark.integration

#: What a page's examples name that must be fresh in a shared broker and database: each
#: page's topic gets a unique name, its tables are dropped first, its paths move to tmp_path.
TOPICS = {"events": 4}
TABLES = ("clicks_per_minute", "counts", "guide_events", "guide_events_late")
PATHS = ("/tmp/flinkish-getting-started", "/tmp/flinkish-readme", "/tmp/flinkish-guide",
         "/tmp/flinkish-migrate")
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _run_python(block: Block, namespace: dict[str, Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
    return out.getvalue()


def _run_bash(block: Block, env: dict[str, str], cwd: Path) -> str:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=env, cwd=cwd,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{block.where} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_examples_run_and_print_what_the_page_shows(
    page: Path, spark: Any, kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renames = {f'"{name}"': f'"{name}-{uuid.uuid4().hex[:8]}"' for name in TOPICS}
    for name, partitions in TOPICS.items():
        create_topic(kafka_bootstrap, renames[f'"{name}"'].strip('"'), partitions)
    renames |= {path: str(tmp_path / Path(path).name) for path in PATHS}
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_flinkish_epochs")
    monkeypatch.setenv(EXTERNAL_ENV, kafka_bootstrap)
    monkeypatch.setenv(DSN_ENV, postgres_dsn)
    # the pages show commands' output at 100 columns
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               COLUMNS="100")
    conf = {key: spark.conf.get(key) for key in ("spark.sql.shuffle.partitions",)}
    before = {query.id for query in spark.streams.active}
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    printed: str | None = None
    try:
        for block in blocks(page):
            code = block.code
            for old, new in renames.items():
                code = code.replace(old, new)
            block = Block(block.page, block.line, block.language, code, block.marker,
                          block.argument)
            if block.marker is None and block.language == "python":
                printed = _run_python(block, namespace)
            elif block.marker is None and block.language == "bash":
                printed = _run_bash(block, env, tmp_path)
            elif block.marker == "output":
                assert printed is not None, f"{block.where}: no output to compare"
                assert _CHECKER.check_output(block.code, printed, _FLAGS), (
                    f"{block.where}: the example printed\n{printed}\nthe page shows\n"
                    f"{block.code}")
            # a picture or a record (ILLUSTRATIONS) is shown as is
            assert block.marker is not None or block.language in RUNNABLE + ILLUSTRATIONS
    finally:
        for query in spark.streams.active:
            if query.id not in before:  # an example's query that did not end by itself
                query.stop()
        namespace.clear()  # the examples' clients close before the session's broker stops
        for key, value in conf.items():
            spark.conf.set(key, value)
