"""A ``foreachBatch`` function's failure as Spark's stop check reads it (flinkish.batch_errors):
the traceback py4j hands Spark, matched by the JDK against Spark's ``PROXY_ERROR`` on a 1 MB
stack (tests/java/ProxyError.java), overflows as it comes from a stopped ``collect()``; the
replacement is decided as the whole traceback would be with an unbounded stack, and keeps the
exceptions' classes and messages."""

from __future__ import annotations

import re
import shutil
import subprocess
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flinkish.batch_errors import INTERRUPTIONS, PROXY_ERROR_PREFIX, BatchFunctionError, stoppable

_JAVA = shutil.which("java")
_HARNESS = Path(__file__).parent / "java" / "ProxyError.java"
needs_java = pytest.mark.skipif(_JAVA is None, reason="needs java (the JDK's java.util.regex)")

#: Spark's StreamExecution.PROXY_ERROR; Python's re does not recurse per character
PROXY_ERROR = re.compile(re.escape(PROXY_ERROR_PREFIX) + r"((.|\r\n|\r|\n)*)("
                         + "|".join(map(re.escape, INTERRUPTIONS)) + ")")


def _frames(count: int) -> str:
    """Java stack frames as a collect() in Spark's stream thread has them (~90)."""
    return "".join(f"\tat org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"
                   f".runBatch{i}(MicroBatchExecution.scala:{100 + i})\n" for i in range(count))


def _java_error(java: str) -> BaseException:
    """An exception printed as py4j's Py4JJavaError prints: the call, then the Java trace."""
    text = f"An error occurred while calling o72.collectToPython.\n: {java}"
    cls = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol",
                                               "__str__": lambda self: text})
    return cls()


def _handed_to_spark(func: Callable[[Any, int], None]) -> str:
    """What py4j's callback server hands Spark when ``func`` fails: its traceback."""
    try:
        func(None, 7)
    except Exception:
        return traceback.format_exc()
    raise AssertionError("the function did not fail")


def _spark_decides(texts: list[str]) -> list[str]:
    """'match', 'no match' or 'overflow' per text: java.util.regex on a 1 MB thread stack."""
    assert _JAVA is not None
    done = subprocess.run([_JAVA, str(_HARNESS)], input="".join(t + "\0" for t in texts)[:-1],
                          capture_output=True, text=True, encoding="utf-8", timeout=120,
                          check=True)
    return done.stdout.splitlines()


INTERRUPTED = f"java.lang.InterruptedException\n{_frames(90)}"
CASES = {
    # stop() interrupts the stream thread waiting for the job (as measured: 9,197 characters)
    "interrupted": INTERRUPTED,
    "interrupted-deeper": (f"org.apache.spark.SparkException: Job 3 failed\n{_frames(60)}"
                           f"Caused by: java.io.InterruptedIOException: read interrupted\n"
                           f"{_frames(30)}\t... 41 more\n"),
    "failed": (f"org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
               f"stage 3.0 failed 1 times\n{_frames(90)}"),
}


def _raising(java: str, during: bool = False) -> Callable[[Any, int], None]:
    def func(df: Any, epoch: int) -> None:
        if not during:
            raise _java_error(java)
        try:
            raise _java_error(java)
        except Exception:
            raise ValueError("the user's function gave up")  # noqa: B904 (as users write it)

    return func


@needs_java
@pytest.mark.parametrize("during", [False, True], ids=["raised", "while-handling"])
def test_spark_decides_on_the_replacement_as_on_the_whole_traceback(during: bool) -> None:
    originals = [_handed_to_spark(_raising(java, during)) for java in CASES.values()]
    replaced = [_handed_to_spark(stoppable(_raising(java, during))) for java in CASES.values()]
    unbounded = ["match" if PROXY_ERROR.search(text) else "no match" for text in originals]
    assert unbounded == ["match", "match", "no match"]
    # as they come: Spark's stream thread dies on each
    assert _spark_decides(originals) == ["overflow"] * len(CASES)
    assert _spark_decides(replaced) == unbounded
    for text in replaced:
        assert len(text) - text.find(PROXY_ERROR_PREFIX) < 1_000 or PROXY_ERROR_PREFIX not in text


def test_the_replacement_keeps_every_exception_and_drops_the_frames() -> None:
    func = stoppable(_raising(CASES["interrupted-deeper"], during=True))
    with pytest.raises(BatchFunctionError) as failure:
        func(None, 7)
    message = str(failure.value)
    assert "o72.collectToPython" in message
    assert "org.apache.spark.SparkException: Job 3 failed" in message
    assert "Caused by: java.io.InterruptedIOException: read interrupted" in message
    assert "ValueError: the user's function gave up" in message
    assert "\tat " not in message and "more" not in message
    assert failure.value.interrupted
    assert failure.value.original.__class__ is ValueError
    assert failure.value.__suppress_context__  # the long traceback is not printed with it


def test_short_failures_and_other_errors_leave_unchanged() -> None:
    short = _java_error("java.lang.InterruptedException\n")
    other = RuntimeError("x" * 20_000)

    for error in (short, other):
        def func(df: Any, epoch: int, error: BaseException = error) -> None:
            raise error

        with pytest.raises(type(error)) as failure:
            stoppable(func)(None, 1)
        assert failure.value is error


def test_the_valve_hands_spark_the_replacement(tmp_path: Path) -> None:
    from flinkish.foreach_batch import ValveForEachBatch

    class Batch:
        columns = ["kind"]

        def persist(self) -> Any:
            raise _java_error(INTERRUPTED)

    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "metadata").write_text('{"id": "query-1"}\n')
    valve = ValveForEachBatch(lambda batch: None, str(tmp_path / "checkpoint"))
    with pytest.raises(BatchFunctionError) as failure:
        valve(Batch(), 0)
    assert failure.value.interrupted
