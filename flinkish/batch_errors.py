"""What a ``foreachBatch`` function's failure hands Spark: short enough for Spark's stop check.

A query stopped while its ``foreachBatch`` function runs a Spark job fails it with a
``Py4JJavaError`` whose message carries the whole Java stack trace. Spark matches it against
``StreamExecution.PROXY_ERROR``, and ``java.util.regex`` recurses about five frames per
character after its prefix: a default 1 MB thread stack overflows at about 2,000, ending Spark's
stream thread without its cleanup. :func:`spark_safe_errors` replaces such a failure by one with
every exception's class and message, no Java frames, and a short closing line that matches
``PROXY_ERROR`` when an interruption caused it, so Spark decides as it would have.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["BatchFunctionError", "spark_safe_errors", "stoppable"]

log = logging.getLogger(__name__)

#: the literal start of Spark's ``StreamExecution.PROXY_ERROR``
PROXY_ERROR_PREFIX = "py4j.protocol.Py4JJavaError: An error occurred while calling"
#: ``StreamExecution.IO_EXCEPTION_NAMES``: an interruption, which a stop() causes
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")
#: a message this much longer than the prefix is replaced (java.util.regex overflows a 512 KB
#: stack at ~1,000 characters after it, a 1 MB one at ~2,000)
SAFE_TAIL = 300
#: the replacement's exception lines, at most (text before the prefix costs the regex no stack)
MAX_MESSAGE = 8_000
_JAVA_FRAME = re.compile(r"^\s+(at \S|\.\.\. \d+ more$)")
_CALLED = re.compile(r"py4j\.protocol\.Py4JJavaError: An error occurred while calling "
                     r"(\S+?)\.?$", re.MULTILINE)

F = TypeVar("F", bound=Callable[..., Any])


class BatchFunctionError(Exception):
    """A ``foreachBatch`` function's failure with the Java stack frames taken out of its
    message (``original`` is the exception itself)."""

    def __init__(self, message: str, original: BaseException, interrupted: bool) -> None:
        super().__init__(message)
        self.original = original
        self.interrupted = interrupted


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, oldest first."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return chain[::-1]


def _exception_lines(exc: BaseException) -> list[str]:
    import traceback

    lines: list[str] = []
    for link in _chain(exc):
        text = "".join(traceback.format_exception_only(type(link), link))
        lines += [line for line in text.splitlines() if not _JAVA_FRAME.match(line)]
    return lines


def replacement(exc: BaseException) -> BatchFunctionError | None:
    """What to raise instead of ``exc``, or None when Spark can match ``exc``'s traceback
    safely (no ``Py4JJavaError`` in it, or a short one)."""
    import traceback

    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    at = full.find(PROXY_ERROR_PREFIX)
    if at < 0 or len(full) - at - len(PROXY_ERROR_PREFIX) <= SAFE_TAIL:
        return None
    tail = full[at + len(PROXY_ERROR_PREFIX):]
    interruption = next((name for name in INTERRUPTIONS if name in tail), None)
    # the prefix once, at the end: the exception lines before it name the call otherwise
    lines = [line.replace(PROXY_ERROR_PREFIX, "py4j.protocol.Py4JJavaError calling")
             for line in _exception_lines(exc)]
    message = "\n".join(lines)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + " [...]"
    if interruption is not None:
        called = _CALLED.match(full, at)
        method = called.group(1) if called else "?"
        message += f"\n(interrupted: {PROXY_ERROR_PREFIX} {method}: {interruption})"
    return BatchFunctionError(message, exc, interruption is not None)


@contextmanager
def spark_safe_errors() -> Iterator[None]:
    """Around a ``foreachBatch`` function's body: a failure whose message Spark's stop check
    could not match within a thread's stack leaves as a :class:`BatchFunctionError` (the
    full traceback is logged at DEBUG when an interruption caused it, else at ERROR)."""
    try:
        yield
    except Exception as exc:
        short = replacement(exc)
        if short is None:
            raise
        log.log(logging.DEBUG if short.interrupted else logging.ERROR,
                "foreachBatch function failed", exc_info=exc)
        raise short from None


def stoppable(func: F) -> F:
    """``df.writeStream.foreachBatch(flinkish.stoppable(func))``: ``func`` whose failures
    Spark's stop check can read (see :mod:`flinkish.batch_errors`); a query stopped while
    ``func`` runs a Spark job then ends as a stop does, not with a ``StackOverflowError`` in
    Spark's stream thread.

    Args:
        func: the ``foreachBatch`` function, ``func(df, epoch_id)``.

    Returns:
        ``func`` wrapped: the same calls and results; a failure is logged whole and re-raised
        with a short traceback.
    """

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        with spark_safe_errors():
            return func(*args, **kwargs)

    return run  # type: ignore[return-value]
