"""Riding out a target that is away for a while: which errors mean "away", and the retries.

A failed Spark micro-batch ends the query (where Flink would restart the job), so the sink
retries a step that failed because its target could not be reached, with backoff, for up to
``outageTimeout``. What is retried and why no row is doubled: docs/guides/recover-after-crash.md,
"When the target is away for a while".
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from checkpointing.fencing import FencedError
from flinkish_core.durations import format_duration
from flinkish_sink.row_spill import RowSpill
from flinkish_sink.target import AnyTarget, PreCommit, TaskTransaction, TransactionId

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: SQLSTATEs of a connection lost or not taken yet: class 08, shutdown, cannot-connect-now.
_PG_TRANSIENT_CLASS = "08"
_PG_TRANSIENT_STATES = frozenset({"57P01", "57P02", "57P03"})
#: What libpq says, without a SQLSTATE, when the server refused the login or the settings.
_PG_LOGIN_REFUSED = (
    "authentication", "password", "pg_hba.conf", "does not exist", "permission denied",
    "certificate", "sslmode", "invalid connection option", "invalid dsn")

#: An object store's (AWS SDK, object_store, HTTP) words for a request it could not serve now.
_STORE_UNREACHABLE = re.compile(
    r"connection refused|connection reset|connection aborted|connection closed|broken pipe"
    r"|could not connect|couldn't connect|failed to connect|tcp connect error"
    r"|network_connection|error sending request|unexpected eof|end of file"
    r"|timed out|timeout|temporarily unavailable|service[ _]unavailable|slow[ _]?down"
    r"|internal server error|bad gateway|gateway timeout|internal_failure|request_timeout"
    r"|\b(?:status|code)\b\D{0,12}\b5\d\d\b", re.IGNORECASE)
#: ... and for a request the store refused: no retry makes it pass.
_STORE_REFUSED = re.compile(
    r"access ?denied|forbidden|unauthori[sz]ed|invalidaccesskeyid|signaturedoesnotmatch"
    r"|expiredtoken|invalidtoken|no ?such ?bucket|\b(?:status|code)\b\D{0,12}\b40[13]\b",
    re.IGNORECASE)


class TargetUnavailableError(RuntimeError):
    """A target stayed unreachable for longer than the sink's ``outageTimeout``."""


def postgres_transient(error: BaseException) -> bool | None:
    """Whether a psycopg error means PostgreSQL could not be reached for now; None if
    ``error`` is not psycopg's."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        return None
    if not isinstance(error, psycopg.Error):
        return None
    state = error.sqlstate
    if state:
        return state.startswith(_PG_TRANSIENT_CLASS) or state in _PG_TRANSIENT_STATES
    if not isinstance(error, psycopg.OperationalError):
        return False
    # libpq's own failures (connection refused, server closed the connection unexpectedly,
    # consuming input failed) carry no SQLSTATE; neither does a refused login
    text = str(error).lower()
    return not any(words in text for words in _PG_LOGIN_REFUSED)


def object_store_transient(error: BaseException) -> bool | None:
    """Whether an object store's or the network's error means the store could not be reached
    or serve for now; None if it is not such an error."""
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    if not isinstance(error, OSError):
        # delta-rs and pyarrow's AWS SDK raise the store's failures as OSError
        return None
    if isinstance(error, FileNotFoundError | FileExistsError | PermissionError
                  | IsADirectoryError | NotADirectoryError):
        return False
    text = str(error)
    if _STORE_REFUSED.search(text):
        return False
    return bool(_STORE_UNREACHABLE.search(text)) or None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from or during (and SQLAlchemy's ``orig``)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        current = (current.__cause__ or current.__context__
                   or (orig if isinstance(orig, BaseException) else None))


def is_transient(error: BaseException) -> bool:
    """Whether retrying the step that raised ``error`` may succeed once the target is back:
    the first error of the chain with a verdict decides (its own ``transient`` first)."""
    for link in _chain(error):
        declared = getattr(link, "transient", None)
        if isinstance(declared, bool):
            return declared
        if isinstance(link, FencedError | TargetUnavailableError):
            return False
        for verdict in (postgres_transient(link), object_store_transient(link)):
            if verdict is not None:
                return verdict
    return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter up to ``timeout_s`` after the step's first attempt
    (0: no retry). Picklable: it travels to the write tasks."""

    timeout_s: float
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delays(self) -> Iterator[float]:
        """The pauses before each retry, each from the upper half of the backoff ("equal
        jitter": clients that lost the same server do not come back in step)."""
        backoff = self.initial_backoff_s
        while True:
            yield random.uniform(backoff / 2, backoff)
            backoff = min(self.max_backoff_s, backoff * self.multiplier)

    def call(self, target: object, what: str, step: Callable[[], T],
             on_retry: Callable[[BaseException], None] | None = None) -> T:
        """``step()``, again after each transient failure until ``timeout_s`` has passed;
        ``on_retry(error)`` runs before each pause (to drop a broken connection)."""
        start = self.clock()
        delays = self.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                return step()
            except Exception as error:
                if self.timeout_s <= 0 or not is_transient(error):
                    raise
                elapsed = self.clock() - start
                left = self.timeout_s - elapsed
                if left <= 0:
                    raise TargetUnavailableError(
                        f"{target!r}: {what} failed: the target stayed unreachable for "
                        f"{format_duration(elapsed)} ({attempt} attempts), longer than the "
                        f"sink's outageTimeout ({format_duration(self.timeout_s)}); last "
                        f"error: {type(error).__name__}: {' '.join(str(error).split())}"
                    ) from error
                pause = min(left, next(delays))
                logger.warning(
                    "%r unreachable: %s failed (attempt %d, %s of outageTimeout left), "
                    "retrying in %s: %s", target, what, attempt, format_duration(left),
                    format_duration(pause), _first_line(error))
                if on_retry is not None:
                    on_retry(error)
                self.sleep(pause)


_NO_RETRY = RetryPolicy(0)


class RetriedTransaction:
    """A task's transaction that survives its target going away for a while: the rows are
    kept (:class:`RowSpill`) until the pre-commit, and after a lost connection what the lost
    attempt left under the id is rolled back (a PREPARE may have happened), the transaction
    begun again under the same id and the rows written again. A target whose client rides
    out outages itself (Kafka) keeps no copy: only its begin is retried."""

    def __init__(self, target: AnyTarget, txn: TransactionId, schema: pa.Schema,
                 policy: RetryPolicy) -> None:
        self._target = target
        self._txn = txn
        self._schema = schema
        self._policy = policy
        rewrites = policy.timeout_s > 0 and not getattr(target, "client_rides_out_outages", False)
        self._written = RowSpill(schema) if rewrites else None
        self._open: TaskTransaction | None = None
        self._lost = False  # a transient failure left the transaction's state unknown
        self._step(lambda _: None, "begin")

    def _step(self, action: Callable[[TaskTransaction], T], what: str) -> T:
        def attempt() -> T:
            if self._open is None:
                if self._lost:
                    self._target.rollback(self._txn)
                    self._lost = False
                self._open = self._target.begin_transaction(self._txn, self._schema)
                if self._written is not None:
                    for batch in self._written.batches():
                        self._open.write(batch)
            return action(self._open)

        # without the rows kept, a retry once any is written would lose them
        policy = self._policy if self._written is not None or what == "begin" else _NO_RETRY
        return policy.call(self._target, f"{what} of {self._txn.gid}", attempt,
                           on_retry=self._drop)

    def _drop(self, error: BaseException) -> None:
        self._lost = True
        if self._open is not None:
            try:
                self._open.abort()
            except Exception:  # the target is away: the rollback before the next attempt
                logger.debug("abort of %s after %s", self._txn.gid, error, exc_info=True)
            self._open = None

    def write(self, batch: pa.RecordBatch) -> None:
        self._step(lambda open_: open_.write(batch), "write")
        if self._written is not None:
            self._written.append(batch)

    def pre_commit(self) -> PreCommit:
        pre_commit = self._step(lambda open_: open_.pre_commit(), "pre-commit")
        if self._written is not None:
            self._written.close()
        return pre_commit

    def abort(self) -> None:
        if self._written is not None:
            self._written.close()
        if self._open is not None:
            self._open.abort()
            self._open = None
