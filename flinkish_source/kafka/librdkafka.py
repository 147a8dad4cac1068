"""Range reads through confluent-kafka's consumer: :class:`RangeReader` serves a task's announced
ranges in order from one consumer that fetches the next ranges while the current one is read.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_END, KafkaError, KafkaException, Message, TopicPartition

from flinkish_source.kafka import base
from flinkish_source.kafka.base import (
    OUT_OF_RANGE,
    SHORT_LOG_PAUSE_S,
    WAIT_OPTION,
    BrokerWait,
    ConsumerPool,
    KafkaUnavailableError,
    RangeKey,
    ShortLog,
    error_hint,
    no_records_reason,
    raise_refusal,
    read_consumer_config,
    retention_loss,
    retry_step,
    servers,
)
from flinkish_source.options import SourceOptions

logger = logging.getLogger(__name__)

#: How long a task waits for the leaders of a newly assigned topic (see ``RangeReader._assign``)
#: before it leaves them to librdkafka's own metadata scan.
LEADER_LOOKUP_TIMEOUT_S = 1.0


@dataclass
class _Range:
    topic: str
    partition: int
    start: int
    end: int
    position: int  # the next offset this range expects from the consumer
    chunks: deque[list[Message]] = field(default_factory=deque)  # read, not yet served
    assigned: bool = False
    done: bool = False
    opened: bool = False  # read() was called
    short: ShortLog | None = None  # the partition's log ends before position (for now)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class RangeReader:
    """Reads offset ranges of several partitions with one pooled consumer, fetching ahead in the
    announced order as long as the offsets still to serve before a range stay within
    ``lookahead``: many small ranges take one round trip, and a large one does not pile up in
    memory. A finished range's partition is unassigned at once, so nothing is fetched past it."""

    def __init__(self, options: SourceOptions, ranges: Sequence[RangeKey], chunk: int,
                 pool: ConsumerPool | None = None, lookahead: int | None = None) -> None:
        self._options = options
        self._chunk = chunk
        self._pool = pool or base.POOL  # the pool of the moment (a test may swap it)
        self._lookahead = lookahead if lookahead is not None else max(2 * chunk, 50_000)
        self._config: dict[str, Any] | None = None
        self._consumer: Any = None
        self._ranges = [_Range(t, p, s, e, s) for t, p, s, e in ranges if e > s]
        self._by_key = {(r.topic, r.partition, r.start, r.end): r for r in self._ranges}
        self._assigned: dict[tuple[str, int], _Range] = {}
        self._cursor = 0  # ranges before it were assigned once (or are being read)
        self._buffered = 0  # messages read and not yet served, all ranges
        self._current: _Range | None = None

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(failed=exc[0] is not None and exc[0] is not GeneratorExit)

    def close(self, failed: bool = False) -> None:
        """Hand the consumer back to the pool (closed instead if reading ``failed``)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            assert self._config is not None
            self._pool.release(self._config, consumer, clean=not failed)

    def _client(self) -> Any:
        if self._consumer is None:
            self._config = read_consumer_config(self._options.kafka)
            self._consumer = self._pool.acquire(self._config)
        return self._consumer

    def _offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's earliest and latest offset now, from one ListOffsets."""
        consumer, tp = self._client(), TopicPartition(topic, partition)
        low, high = BrokerWait(
            self._options.kafka, f"could not read the offsets of {topic}/{partition}"
        ).call(lambda t: consumer.get_watermark_offsets(tp, timeout=t, cached=False))
        return int(low), int(high)

    def _assign(self, ranges: list[_Range]) -> None:
        """Assign ranges in one call, then ask for the leaders of topics the consumer never
        had: a connected consumer finds a new topic's leaders only at its next scan of unavailable
        topics, up to a second later, and fetches nothing until then."""
        todo = []
        for r in ranges:
            if not (r.assigned or r.done or (r.topic, r.partition) in self._assigned):
                r.assigned = True
                self._assigned[(r.topic, r.partition)] = r
                todo.append(TopicPartition(r.topic, r.partition, r.position))
        if not todo:
            return
        consumer = self._client()
        consumer.incremental_assign(todo)
        for topic in self._pool.new_topics(consumer, {tp.topic for tp in todo}):
            with contextlib.suppress(KafkaException):
                consumer.list_topics(topic, timeout=LEADER_LOOKUP_TIMEOUT_S)

    def _unassign(self, r: _Range) -> None:
        if r.assigned:
            r.assigned = False
            del self._assigned[(r.topic, r.partition)]
            self._client().incremental_unassign([r.tp])

    def _finish(self, r: _Range) -> None:
        r.done = True
        self._unassign(r)

    def _fetch_ahead(self) -> None:
        """Assign the current range, and the ranges after the ones already assigned while the
        offsets still to serve (read or not) stay under ``lookahead``."""
        current = self._current
        todo = [] if current is None or current.done or current.assigned else [current]
        ahead = self._buffered + sum(r.end - r.position for r in [*self._assigned.values(), *todo])
        taken = {(r.topic, r.partition) for r in todo}
        while self._cursor < len(self._ranges) and ahead < self._lookahead:
            r = self._ranges[self._cursor]
            if r.assigned or r.done or r is current or r.position != r.start:
                self._cursor += 1  # assigned before, or read out of turn
                continue
            key = (r.topic, r.partition)
            if key in self._assigned or key in taken:
                break  # another range of its partition first
            todo.append(r)
            taken.add(key)
            ahead += r.end - r.position
            self._cursor += 1
        self._assign(todo)

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[list[Message]]:
        """Records of one announced range, ``start <= offset < end``, in chunks (see
        :func:`read_range`)."""
        r = self._by_key.get((topic, partition, start, end))
        if r is None:
            if end > start:
                raise ValueError(f"{topic}/{partition} {start}..{end} was not announced")
            return
        if r.opened:
            raise ValueError(f"{topic}/{partition} {start}..{end} is read twice")
        r.opened = True
        options = self._options
        timeout = options.kafka.poll_timeout_ms / 1000
        step = retry_step(timeout)
        self._current = r
        last_progress = time.monotonic()
        next_warning = last_progress + step
        while True:
            if r.chunks:
                yield self._serve(r)
                last_progress = time.monotonic()
                next_warning = last_progress + step
                continue
            if r.done:
                break
            holder = self._assigned.get((r.topic, r.partition))
            if holder is not None and holder is not r:
                self._unassign(holder)  # it keeps what it read, fetched again in its turn
            self._fetch_ahead()
            self._poll()
            raise_refusal(options.kafka, f"could not read {topic}/{partition}")
            if r.chunks or r.done:
                continue
            fetch_pos = self._client().position([r.tp])[0].offset
            waited = time.monotonic() - last_progress
            if fetch_pos != OFFSET_END and fetch_pos >= r.end:
                self._finish(r)  # only transaction markers were left
            elif r.short is not None:
                skipped_to = r.short.wait(options, topic, partition, r.position, end)
                if skipped_to is not None:  # failOnDataLoss=false: the rest is gone
                    r.position, r.short = skipped_to, None
                    self._finish(r)
            elif waited > timeout:
                raise KafkaUnavailableError(
                    f"{topic}/{partition}: no records between offsets {r.position} and "
                    f"{end} within {timeout:g} s (option {WAIT_OPTION} bounds this wait): "
                    f"{self._stalled(r)}; " + error_hint(options.kafka)
                )
            elif time.monotonic() >= next_warning:
                logger.warning(
                    "%s/%d: still waiting for records between offsets %d and %d from "
                    "bootstrap servers %r after %.1f s, giving up in %.1f s (option %s=%d "
                    "bounds the wait): %s", topic, partition, r.position, end,
                    servers(options.kafka), waited, timeout - waited, WAIT_OPTION,
                    options.kafka.poll_timeout_ms, self._stalled(r),
                )
                next_warning = time.monotonic() + step
        self._current = None
        self._fetch_ahead()

    def _stalled(self, r: _Range) -> str:
        """Why a range waits, from the high watermark of the partition's last fetch answer."""
        high = int(self._client().get_watermark_offsets(r.tp, cached=True)[1])
        return no_records_reason(self._options.kafka, r.position, high)

    def _serve(self, r: _Range) -> list[Message]:
        """The range's next chunk: its buffered chunks merged up to ``chunk`` messages."""
        out = r.chunks.popleft()
        while r.chunks and len(out) + len(r.chunks[0]) <= self._chunk:
            out = out + r.chunks.popleft()
        self._buffered -= len(out)
        return out

    def _poll(self) -> None:
        """One consume call; its messages go to their ranges."""
        consumer = self._client()
        pending = sum(r.end - r.position for r in self._assigned.values())
        msgs = consumer.consume(num_messages=max(1, min(self._chunk, pending)), timeout=0.1)
        if not msgs:
            return
        topics = {r.topic for r in self._assigned.values()}
        if len(topics) == 1:
            # librdkafka hands out a partition's messages in runs: split at partition changes
            (topic,) = topics
            parts = [m.partition() for m in msgs]
            if parts.count(parts[0]) == len(parts):
                bounds = [0, len(msgs)]
            else:
                bounds = [0] + [i for i in range(1, len(parts)) if parts[i] != parts[i - 1]]
                bounds.append(len(msgs))
            for i, j in zip(bounds, bounds[1:], strict=False):
                owner = self._assigned.get((topic, parts[i]))
                if owner is not None and msgs[i].topic() == topic:
                    self._take(owner, msgs if j - i == len(msgs) else msgs[i:j])
            return
        by_partition: dict[tuple[str, int], list[Message]] = {}
        for msg in msgs:
            by_partition.setdefault((msg.topic(), msg.partition()), []).append(msg)
        for key, part in by_partition.items():
            owner = self._assigned.get(key)
            if owner is not None:
                self._take(owner, part)

    def _take(self, r: _Range, msgs: list[Message]) -> None:
        """Messages of one partition, in order: records of the range, end and error events."""
        options = self._options
        end = r.end
        first, last = msgs[0], msgs[-1]
        if not r.done and first.error() is None and last.error() is None:
            low, high = first.offset(), last.offset()
            errors = [m.error() for m in msgs]
            if low >= r.position and high < end and errors.count(None) == len(errors):
                # the common case: records only, all within the range (offsets only grow)
                self._keep(r, msgs)
                r.position, r.short = high + 1, None
                if r.position >= end:
                    self._finish(r)
                return
        out: list[Message] = []
        for msg in msgs:
            if r.done:
                break
            err = msg.error()
            if err is None:
                offset = msg.offset()
                if offset < r.position:
                    continue  # already read (a fetch from before a re-positioning)
                if offset >= end:
                    r.position = end
                    self._finish(r)
                    break
                out.append(msg)
                r.position, r.short = offset + 1, None
                if r.position >= end:
                    self._finish(r)
            elif err.code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= end:
                    r.position = end
                    self._finish(r)
                else:  # waited out in read(): librdkafka keeps fetching
                    r.short = r.short or ShortLog(msg.offset())
            elif err.code() in OUT_OF_RANGE:
                low, high = self._offsets(r.topic, r.partition)
                self._unassign(r)
                if low > r.position:  # deleted by retention, or the topic was recreated
                    r.position = retention_loss(options, r.topic, r.partition, r.position,
                                                low, end)
                    r.short = None
                else:  # the log ends before position, for now: fetched again after a pause
                    r.short = r.short or ShortLog(high)
                    time.sleep(SHORT_LOG_PAUSE_S)
                if r.position < end:
                    self._assign([r])
                else:
                    r.done = True
                break
            else:
                raise KafkaUnavailableError(f"{r.topic}/{r.partition}: {err.str()}")
        if out:
            self._keep(r, out)

    def _keep(self, r: _Range, msgs: list[Message]) -> None:
        r.chunks.append(msgs)
        self._buffered += len(msgs)
