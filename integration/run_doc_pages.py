"""Runs pages of the docs as a reader does, one after another in this process: for each page,
the ``flinkish dev`` command the page shows (in a second terminal, as it were, kept running
until the last page has run), then the page's examples as written, its Python blocks in one
fresh ``__main__`` namespace (a file of them run with ``python``), its shell blocks as
commands, in the current directory. The page sees only the environment ``flinkish dev``
exports. Pages share this process's Spark driver, as one ``python`` session running them in
turn would.

``python -m integration.run_doc_pages RESULTS.json PAGE...`` writes, for each page, whether it
ran and printed what it shows, or where and how it did not.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from integration.doc_examples import (
    DEV_ENV,
    ILLUSTRATIONS,
    RUNNABLE,
    Block,
    blocks,
    dev_command,
)

#: How long flinkish dev may take to stop.
DEV_STOP_S = 60
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class PageFailed(Exception):
    """A block of the page failed, or printed other than the page shows."""


@contextlib.contextmanager
def dev_services(command: str | None) -> Iterator[dict[str, str]]:
    """The page's ``flinkish dev`` line running, and the variables its ``export`` line sets
    (none without a line)."""
    if command is None:
        yield {}
        return
    dev = subprocess.Popen(["bash", "-c", f"exec {command}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        assert dev.stdout is not None
        printed = []
        for line in dev.stdout:  # flinkish dev prints its export line once both servers run
            printed.append(line)
            if line.startswith("export "):
                yield dict(word.split("=", 1) for word in shlex.split(line)[1:])
                return
        raise PageFailed(f"{command!r} printed no export line:\n{''.join(printed)}")
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.communicate(timeout=DEV_STOP_S)


def _run_python(block: Block, namespace: dict[str, Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
    return out.getvalue()


def _run_bash(block: Block, env: dict[str, str]) -> str:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise PageFailed(f"{block.where} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _stop_leftover_queries() -> list[str]:
    """Stop the queries a page left running (a program ending there would leave them
    unfinished) and name them."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return []
    left = []
    for query in spark.streams.active:
        left.append(query.name or query.id)
        query.stop()
    return left


def run_page(page: Path, services: contextlib.ExitStack) -> None:
    """Run the page's examples, raising PageFailed at the first that fails or prints other
    than the page shows. The page's ``flinkish dev`` keeps running in ``services``: the
    driver's Kafka clients of a page's queries may outlive them."""
    exported = services.enter_context(dev_services(dev_command(page)))
    for name in DEV_ENV:
        os.environ.pop(name, None)
    os.environ.update(exported)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    printed: str | None = None
    try:
        for block in blocks(page):
            if block.marker is None and block.language == "python":
                try:
                    printed = _run_python(block, namespace)
                except Exception:
                    raise PageFailed(f"{block.where} failed:\n{traceback.format_exc()}"
                                     ) from None
            elif block.marker is None and block.language == "bash":
                printed = _run_bash(block, dict(os.environ))
            elif block.marker == "output":
                if printed is None:
                    raise PageFailed(f"{block.where}: no output to compare")
                if not _CHECKER.check_output(block.code, printed, _FLAGS):
                    raise PageFailed(f"{block.where}: the example printed\n{printed}\n"
                                     f"the page shows\n{block.code}")
            # a picture or a record (ILLUSTRATIONS) is shown as is
            assert block.marker is not None or block.language in RUNNABLE + ILLUSTRATIONS
        left = _stop_leftover_queries()
        if left:
            raise PageFailed(f"the page leaves queries running: {left}; end them "
                             "(trigger(availableNow=True) and awaitTermination())")
    finally:
        _stop_leftover_queries()
        namespace.clear()  # the page's clients close before its servers stop
        for name in DEV_ENV:
            os.environ.pop(name, None)


def main(argv: list[str]) -> int:
    results_file, *page_names = argv
    results: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as services:
        for name in page_names:
            started = time.monotonic()
            try:
                run_page(Path(name), services)
                error = None
            except PageFailed as failure:
                error = str(failure)
            results[name] = {"error": error, "seconds": round(time.monotonic() - started, 1)}
            print(f"{name}: {'ok' if error is None else 'FAILED'} in "
                  f"{results[name]['seconds']} s", file=sys.stderr, flush=True)
            Path(results_file).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
