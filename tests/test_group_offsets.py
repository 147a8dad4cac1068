"""When the driver-side reader commits completed epochs to the query's consumer group, and how
a failed commit is tried again (``flinkish_source.kafka.group_offsets``; the integration tests
in ``integration/test_kafka_features.py`` run it through Spark and a broker)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from flinkish_source import epoch_notices
from flinkish_source.epoch_notices import canonical
from flinkish_source.kafka import group_offsets
from flinkish_source.kafka.base import TopicPartitionKey
from flinkish_source.kafka.group_offsets import GroupOffsetCommitter
from flinkish_source.offset_planner import PartitionPosition, to_json
from flinkish_source.options import parse_options
from flinkish_source.stream_reader import FlinkishStreamReader

OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
           "includeMarkers": "false", "kafka.group.id": "watch"}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: a socket's path must fit AF_UNIX's 108 bytes, which
    pytest's own ``tmp_path`` can outgrow (under xdist it is a level deeper)."""
    path = Path(tempfile.mkdtemp(prefix="fn-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Recording(GroupOffsetCommitter):
    """The committer with Kafka's answer given by the test."""

    def __init__(self, answers: list[bool] | None = None) -> None:
        super().__init__(parse_options(OPTIONS).kafka)
        self.answers = answers
        self.sent: list[dict[TopicPartitionKey, int]] = []

    def _commit(self, changed: Mapping[TopicPartitionKey, int]) -> bool:
        self.sent.append(dict(changed))
        ok = self.answers.pop(0) if self.answers else True
        if ok:
            self.committed.update(changed)
        return ok


def offset(**offsets: int) -> dict:
    """An end offset as Spark hands it back to the reader (through JSON)."""
    return json.loads(json.dumps(to_json({
        ("t", int(p.lstrip("p"))): PartitionPosition(o, 0, "ACTIVE", 0, o, None, None)
        for p, o in offsets.items()})))


def test_an_epoch_is_committed_when_spark_plans_from_its_end_and_only_then() -> None:
    reader = FlinkishStreamReader(parse_options(OPTIONS))
    committer = reader._committer = Recording()
    reader._commit_to_group(offset(p0=34, p1=33))  # epoch 0 is in Spark's commit log
    assert committer.sent == [{("t", 0): 34, ("t", 1): 33}]
    reader._commit_to_group(offset(p0=34, p1=33))  # a trigger with no new data: no traffic
    reader.commit(offset(p0=34, p1=33))  # Spark's commit(end) comes later: nothing to add
    assert committer.sent == [{("t", 0): 34, ("t", 1): 33}]
    reader._commit_to_group(offset(p0=34, p1=60))  # only what changed is sent
    assert committer.sent[-1] == {("t", 1): 60}


def test_a_notice_commits_only_an_epoch_the_reader_planned() -> None:
    reader = FlinkishStreamReader(parse_options(OPTIONS))
    committer = reader._committer = Recording()
    committer.planned(canonical(offset(p0=34)))
    reader._on_notice({"version": 99, "topics": {}})  # another flinkish version's query
    reader._on_notice(offset(p0=50))  # another query's epoch
    assert committer.sent == []
    reader._on_notice(offset(p0=34))
    assert committer.sent == [{("t", 0): 34}]


def test_without_a_group_nothing_is_committed() -> None:
    reader = FlinkishStreamReader(parse_options(
        {k: v for k, v in OPTIONS.items() if k != "kafka.group.id"}))
    reader._commit_to_group(offset(p0=34))
    assert reader._committer is None


def test_a_failed_commit_is_tried_again_with_the_next_epoch_or_after_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(group_offsets.time, "monotonic", lambda: now[0])
    committer = Recording(answers=[False, False, False, True])

    def commit(offset: int) -> bool:
        return committer.epoch_committed(f"end {offset}", {("t", 0): offset})

    assert not commit(10)
    # Spark plans every few milliseconds while there is no new data: not each time again
    now[0] += 1
    assert not commit(10)
    assert len(committer.sent) == 1
    # the next epoch's offsets are tried at once
    assert not commit(20)
    assert len(committer.sent) == 2
    # the same offsets once the interval has passed
    now[0] += group_offsets.RETRY_INTERVAL_S
    assert not commit(20)
    assert commit(30)
    assert committer.committed == {("t", 0): 30}
    assert commit(30) and len(committer.sent) == 4


def test_a_listener_notice_counts_only_for_an_epoch_the_reader_planned_and_not_committed(
) -> None:
    committer = Recording()
    e1, e2 = canonical(offset(p0=10)), canonical(offset(p0=20))
    committer.planned(e1)
    committer.planned(e2)
    # another query's epoch, or one this reader never planned: ignored
    assert not committer.epoch_committed(canonical(offset(p0=15)), {("t", 0): 15}, notice=True)
    # planning from epoch 2's end commits it (and epoch 1 with it)
    assert committer.epoch_committed(e2, {("t", 0): 20})
    # epoch 1's notice comes late: the group never goes back
    assert not committer.epoch_committed(e1, {("t", 0): 10}, notice=True)
    assert committer.sent == [{("t", 0): 20}]
    e3 = canonical(offset(p0=30))
    committer.planned(e3)
    assert committer.epoch_committed(e3, {("t", 0): 30}, notice=True)
    assert committer.sent[-1] == {("t", 0): 30}


def test_notices_reach_every_listening_reader_and_forget_the_gone(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(epoch_notices.tempfile, "gettempdir", lambda: str(short_tmp))
    told: list[Any] = []
    received = threading.Event()

    def on_notice(end: Any) -> None:
        told.append(end)
        if len(told) == 2:
            received.set()

    listener = epoch_notices.NoticeListener(on_notice)
    try:
        assert listener.path is not None and listener.path.parent.stat().st_mode & 0o777 == 0o700
        gone = listener.path.parent / "gone.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(gone))  # bound, never listening: its process has ended
        assert epoch_notices.send([offset(p0=1), offset(p0=2)]) == 1
        assert received.wait(10)
        assert told == [offset(p0=1), offset(p0=2)]
        assert not gone.exists()
    finally:
        listener.close()
    assert not list(short_tmp.glob("*/*.sock"))


def test_notices_refuse_a_directory_others_can_enter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(epoch_notices.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / f"flinkish-epochs-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(tmp_path / f"flinkish-epochs-{os.getuid()}", 0o777)
    assert epoch_notices.notice_dir() is None
    assert epoch_notices.send([offset(p0=1)]) == 0


def test_the_committer_connects_with_the_sources_translated_security_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import confluent_kafka

    built: dict[str, Any] = {}

    class Built:
        def __init__(self, config: dict[str, Any]) -> None:
            built.update(config)

    monkeypatch.setattr(confluent_kafka, "Consumer", Built)
    options = parse_options({
        **OPTIONS, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                  'required username="etl" password="s3cret";'})
    GroupOffsetCommitter(options.kafka)._client()
    assert (built["sasl.username"], built["sasl.password"]) == ("etl", "s3cret")
    assert built["group.id"] == "watch" and built["security.protocol"] == "SASL_SSL"
