"""CheckpointStore: pending -> completed, subsumption, retention, recovery, crashes, fencing."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from checkpointing import (
    AlreadyCompletedError,
    CheckpointStorage,
    CheckpointStore,
    CorruptRecordError,
    FencedError,
    SubsumedError,
)
from checkpointing.checkpoint_store import LATEST_POINTER, record_path
from checkpointing.fencing import OWNER_RECORD, claim_path
from checkpointing.storage import TEMP_PREFIX


def make_storage(kind: str, root: Path) -> CheckpointStorage:
    """A fresh handle on ``root/loc``: local disk, or a non-local filesystem (one PUT each)."""
    if kind == "local":
        return CheckpointStorage.open(str(root / "loc"))
    return CheckpointStorage(pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem()), "loc")


@pytest.fixture(params=["local", "object"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage(kind: str, tmp_path: Path) -> CheckpointStorage:
    return make_storage(kind, tmp_path)


def reopen(kind: str, root: Path, *, retain: int = 10, owner: str = "q1") -> CheckpointStore:
    """A new run of the query: fresh storage handle, fresh store (a new generation)."""
    return CheckpointStore(make_storage(kind, root), owner=owner, retain=retain)


def raw(root: Path, relpath: str) -> Path:
    return root / "loc" / relpath


def record_name(checkpoint_id: int) -> str:
    return record_path("d", checkpoint_id).split("/")[1]


class SimulatedCrash(Exception):
    pass


@contextmanager
def crash_at(storage: CheckpointStorage, step: int) -> Iterator[list[str]]:
    """Make the ``step``-th (0-based) write or delete through ``storage`` raise, as if the
    process died there; yields the mutations that went through before it."""
    done: list[str] = []
    real_write, real_delete = storage.write_json, storage.delete

    def mutate(real: Any, name: str) -> Any:
        def wrapper(relpath: str, *args: Any) -> None:
            if len(done) == step:
                raise SimulatedCrash(f"crash before {name} {relpath}")
            real(relpath, *args)
            done.append(f"{name} {relpath}")

        return wrapper

    storage.write_json = mutate(real_write, "write")  # type: ignore[method-assign]
    storage.delete = mutate(real_delete, "delete")  # type: ignore[method-assign]
    try:
        yield done
    finally:
        del storage.write_json, storage.delete


# -- lifecycle -------------------------------------------------------------------------------


def test_pending_then_completed(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    assert store.latest_completed() is None
    pending = store.begin(3, {"decision": ["flinkish:q1:3:0:0"]})
    assert store.pending(3) == pending
    assert store.pending_ids() == [3]
    assert pending.state == {"decision": ["flinkish:q1:3:0:0"]}

    completed = store.complete(3, {"watermark": 1000, "rows": 7})
    assert completed.checkpoint_id == 3
    assert completed.state == {"watermark": 1000, "rows": 7}
    assert completed.created_ms == pending.created_ms <= completed.completed_ms
    assert store.pending(3) is None
    assert store.pending_ids() == []
    assert store.completed(3) == completed
    assert store.completed_ids() == [3]
    assert store.latest_completed() == completed


def test_complete_without_begin(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    completed = store.complete(0, {"a": 1})
    assert completed.created_ms == completed.completed_ms
    assert store.latest_completed() == completed


def test_state_is_stored_as_json(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    state: dict[str, Any] = {"t": (1, 2)}
    completed = store.complete(0, state)
    state["t"] = "mutated"
    assert completed.state == {"t": [1, 2]} == store.completed(0).state  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="JSON object"):
        store.complete(1, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        store.begin(1, {"x": float("inf")})


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_bad_ids(storage: CheckpointStorage, bad: Any) -> None:
    store = CheckpointStore(storage, owner="q1")
    for call in (store.begin, store.abort, store.pending, store.completed):
        with pytest.raises(ValueError, match="checkpoint id must be an int >= 0"):
            call(bad)
    with pytest.raises(ValueError, match="checkpoint id"):
        store.complete(bad, {})


def test_begin_is_idempotent_first_state_wins(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    first = store.begin(5, {"decision": "a"})
    assert store.begin(5, {"decision": "b"}) == first
    store.abort(5)
    assert store.begin(5, {"decision": "b"}).state == {"decision": "b"}


def test_subsumption(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    for i in (1, 2, 3, 4):
        store.begin(i, {"i": i})
    store.complete(3, {"done": 3})
    assert store.pending_ids() == [4]
    assert store.pending(1) is None and store.pending(2) is None
    assert store.pending(4) is not None
    assert storage.list("pending") == [record_name(4)]  # the subsumed ones are deleted
    with pytest.raises(SubsumedError, match="checkpoint 2 .* below the latest completed .* 3"):
        store.complete(2, {})
    with pytest.raises(SubsumedError):
        store.begin(1)
    with pytest.raises(AlreadyCompletedError, match="already completed"):
        store.begin(3)
    store.abort(2)  # already gone: nothing to do


def test_recomplete_returns_recorded_state(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    first = store.complete(7, {"v": "first"})
    store.complete(8, {"v": "eight"})
    again = store.complete(7, {"v": "second"})
    assert again == first
    assert store.complete(8, {"v": "other"}).state == {"v": "eight"}
    assert store.latest_completed().checkpoint_id == 8  # type: ignore[union-attr]


def test_abort(storage: CheckpointStorage) -> None:
    store = CheckpointStore(storage, owner="q1")
    store.begin(1, {"x": 1})
    store.abort(1)
    store.abort(1)
    store.abort(99)
    assert store.pending(1) is None
    assert store.pending_ids() == []
    store.complete(2, {})
    with pytest.raises(AlreadyCompletedError, match="cannot abort checkpoint 2"):
        store.abort(2)


@pytest.mark.parametrize("retain", [1, 3])
def test_retention(storage: CheckpointStorage, retain: int) -> None:
    store = CheckpointStore(storage, owner="q1", retain=retain)
    for i in range(10):
        store.complete(i, {"i": i})
        assert len(store.completed_ids()) <= retain
    assert store.completed_ids() == list(range(10 - retain, 10))
    assert store.completed(10 - retain - 1) is None
    assert store.latest_completed().state == {"i": 9}  # type: ignore[union-attr]
    with pytest.raises(SubsumedError, match=f"retain={retain}"):
        store.complete(0, {})


@pytest.mark.parametrize("retain", [0, -1, True, 2.5])
def test_retain_must_be_positive(storage: CheckpointStorage, retain: Any) -> None:
    with pytest.raises(ValueError, match="retain must be an int >= 1"):
        CheckpointStore(storage, owner="q1", retain=retain)


def test_owner_must_be_named(storage: CheckpointStorage) -> None:
    with pytest.raises(ValueError, match="owner"):
        CheckpointStore(storage, owner="")


def test_recovery_from_fresh_instance(kind: str, tmp_path: Path) -> None:
    first = reopen(kind, tmp_path)
    first.begin(4, {"decision": [1]})
    first.complete(4, {"wm": 40})
    first.begin(5, {"decision": [2]})
    second = reopen(kind, tmp_path)
    assert second.generation == first.generation + 1
    assert second.latest_completed() == first.completed(4)
    assert second.pending(5) == first.pending(5)
    assert second.pending_ids() == [5]
    assert second.completed_ids() == [4]


def test_open_removes_leftover_temp_files(kind: str, tmp_path: Path) -> None:
    store = reopen(kind, tmp_path)
    store.complete(1, {})
    (raw(tmp_path, "completed") / f"{TEMP_PREFIX}00000000000000000002.json-dead").write_text("")
    (raw(tmp_path, "") / f"{TEMP_PREFIX}_latest-dead").write_text("")
    reopen(kind, tmp_path)
    assert not [p for p in raw(tmp_path, "").rglob(f"{TEMP_PREFIX}*")]


# -- crashes ---------------------------------------------------------------------------------


def seed(kind: str, root: Path) -> CheckpointStore:
    """Completed 0..4 with retain=3 (so 2, 3, 4 retained), pending 5 and 6."""
    store = reopen(kind, root, retain=3)
    for i in range(5):
        store.complete(i, {"i": i})
    store.begin(5, {"decision": 5})
    store.begin(6, {"decision": 6})
    return store


def test_crash_at_every_step_of_complete(kind: str, tmp_path: Path) -> None:
    steps_seen = []
    step = 0
    while True:
        root = tmp_path / str(step)
        store = seed(kind, root)
        storage = store._storage
        try:
            with crash_at(storage, step) as done:
                store.complete(5, {"i": 5})
        except SimulatedCrash:
            steps_seen.append(done[-1] if done else "(nothing)")
        else:
            break
        recovered = reopen(kind, root, retain=3)
        latest = recovered.latest_completed()
        assert latest is not None
        if step == 0:
            assert latest.state == {"i": 4}  # the record never landed: the old latest
            assert recovered.pending_ids() == [5, 6]
        else:
            assert latest.state == {"i": 5}  # the record landed: the new latest
            assert recovered.pending_ids() == [6]
        # Spark replays the batch: completing again finishes the interrupted steps, and keeps
        # the state recorded before the crash if there is one.
        replayed = recovered.complete(5, {"i": "replayed"})
        assert replayed.state == ({"i": "replayed"} if step == 0 else {"i": 5})
        assert recovered.completed_ids() == [3, 4, 5]
        assert recovered.pending_ids() == [6]
        assert make_storage(kind, root).list("pending") == [record_name(6)]
        assert make_storage(kind, root).read_json(LATEST_POINTER) == {"id": 5}
        step += 1
    # record, pointer, subsumed pending 5, expired completed 2
    assert step == 4, steps_seen


def test_local_crash_inside_record_write_keeps_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    store = seed("local", tmp_path)

    def crash(src: str, dst: str) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.complete(5, {"i": 5})
    monkeypatch.undo()
    recovered = reopen("local", tmp_path, retain=3)
    assert recovered.latest_completed().state == {"i": 4}  # type: ignore[union-attr]
    assert recovered.pending_ids() == [5, 6]


def test_records_beat_a_lagging_pointer(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    with pytest.raises(SimulatedCrash), crash_at(store._storage, 1):
        store.complete(5, {"i": 5})  # record written, pointer still says 4
    assert make_storage(kind, tmp_path).read_json(LATEST_POINTER) == {"id": 4}
    assert reopen(kind, tmp_path).latest_completed().checkpoint_id == 5  # type: ignore[union-attr]


def test_pointer_covers_a_listing_that_misses_the_latest(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = seed(kind, tmp_path)
    # An eventually consistent listing that has not seen the newest records yet.
    real_list = CheckpointStorage.list
    monkeypatch.setattr(
        CheckpointStorage, "list", lambda self, d: [] if d == "completed" else real_list(self, d)
    )
    assert store.latest_completed().state == {"i": 4}  # type: ignore[union-attr]
    assert store.pending_ids() == [5, 6]


def test_corrupt_pointer_is_rebuilt_from_records(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = seed(kind, tmp_path)
    raw(tmp_path, LATEST_POINTER).write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="checkpointing.checkpoint_store"):
        assert store.latest_completed().state == {"i": 4}  # type: ignore[union-attr]
    assert "_latest" in caplog.text and "using the completed records" in caplog.text
    store.complete(5, {"i": 5})
    assert make_storage(kind, tmp_path).read_json(LATEST_POINTER) == {"id": 5}


def test_corrupt_pointer_without_records_raises(kind: str, tmp_path: Path) -> None:
    store = reopen(kind, tmp_path)
    store.complete(0, {})
    shutil.rmtree(raw(tmp_path, "completed"))
    raw(tmp_path, LATEST_POINTER).write_bytes(b"garbage")
    with pytest.raises(CorruptRecordError, match="_latest"):
        store.latest_completed()
    make_storage(kind, tmp_path).write_json(LATEST_POINTER, {"id": "zero"})
    with pytest.raises(CorruptRecordError, match="not a latest-completed pointer"):
        store.latest_completed()


def test_pointer_naming_a_missing_record_raises(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    raw(tmp_path, record_path("completed", 4)).unlink()
    with pytest.raises(CorruptRecordError) as caught:
        store.latest_completed()
    assert caught.value.path.endswith(record_path("completed", 4))
    assert "refusing to fall back" in str(caught.value)


# -- corruption ------------------------------------------------------------------------------


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x20
    path.write_bytes(bytes(data))


def test_corrupt_latest_is_reported_not_skipped(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    target = raw(tmp_path, record_path("completed", 4))
    flip_last_byte(target)
    for read in (store.latest_completed, lambda: store.completed(4), lambda: store.complete(4, {})):
        with pytest.raises(CorruptRecordError, match="bad checksum") as caught:
            read()
        assert caught.value.path.endswith(record_path("completed", 4))
        assert str(tmp_path) in caught.value.path or kind == "object"
    assert reopen(kind, tmp_path).completed(3) is not None  # the others still read


def test_truncated_latest_is_reported(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    target = raw(tmp_path, record_path("completed", 4))
    target.write_bytes(target.read_bytes()[:-5])
    with pytest.raises(CorruptRecordError, match="truncated"):
        store.latest_completed()


def test_corrupt_pending_is_reported(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    flip_last_byte(raw(tmp_path, record_path("pending", 5)))
    with pytest.raises(CorruptRecordError, match=record_path("pending", 5)):
        store.pending(5)
    with pytest.raises(CorruptRecordError, match=record_path("pending", 5)):
        store.complete(5, {})


def test_record_under_the_wrong_name_is_corrupt(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    good = raw(tmp_path, record_path("completed", 3)).read_bytes()
    raw(tmp_path, record_path("completed", 9)).write_bytes(good)
    with pytest.raises(CorruptRecordError, match="holds checkpoint 3, expected 9"):
        store.latest_completed()


def test_record_that_is_not_a_checkpoint_is_corrupt(kind: str, tmp_path: Path) -> None:
    store = seed(kind, tmp_path)
    make_storage(kind, tmp_path).write_json(record_path("completed", 4), {"id": 4})
    with pytest.raises(CorruptRecordError, match="not a checkpoint record"):
        store.latest_completed()


def test_corrupt_claim_record_fails_open(kind: str, tmp_path: Path) -> None:
    reopen(kind, tmp_path)
    flip_last_byte(raw(tmp_path, claim_path(1)))
    with pytest.raises(CorruptRecordError, match=claim_path(1)):
        reopen(kind, tmp_path)


# -- fencing ---------------------------------------------------------------------------------


def test_other_owner_is_fenced(kind: str, tmp_path: Path) -> None:
    store = reopen(kind, tmp_path, owner="orders")
    store.complete(0, {})
    with pytest.raises(FencedError) as caught:
        reopen(kind, tmp_path, owner="payments")
    message = str(caught.value)
    assert "'orders'" in message and "'payments'" in message
    assert make_storage(kind, tmp_path).location in message
    assert "use a different checkpointing.location" in message
    assert "remove the directory if the other query is gone" in message
    store.complete(1, {})  # the owner is unaffected


def test_zombie_generation_is_fenced(kind: str, tmp_path: Path) -> None:
    zombie = reopen(kind, tmp_path)
    zombie.begin(1, {"decision": "old"})
    current = reopen(kind, tmp_path)
    assert current.generation == zombie.generation + 1
    for write in (
        lambda: zombie.begin(2),
        lambda: zombie.complete(1, {}),
        lambda: zombie.abort(1),
    ):
        with pytest.raises(FencedError, match="superseded by generation 2.*zombie"):
            write()
    assert zombie.pending(1) is not None  # reads stay allowed
    current.complete(1, {"by": "current"})
    assert reopen(kind, tmp_path).latest_completed().state == {"by": "current"}  # type: ignore[union-attr]


def test_same_generation_race_is_fenced_by_token(kind: str, tmp_path: Path) -> None:
    store = reopen(kind, tmp_path)
    storage = make_storage(kind, tmp_path)
    record = storage.read_json(claim_path(1))
    # Where creation is check-then-write, another run that read the same old generation can
    # write the same claim after us.
    storage.write_json(claim_path(1), {**record, "token": "someone-else"})
    with pytest.raises(FencedError, match="zombie"):
        store.complete(0, {})


def test_a_claim_lost_at_the_same_moment_is_claimed_again_one_generation_up(
    kind: str, tmp_path: Path
) -> None:
    storage = make_storage(kind, tmp_path)
    first = run_store(kind, tmp_path, "run-a")
    # run-b creates generation 2 between run-c's look and run-c's creation of generation 2
    real_create = storage.create_json
    raced: list[str] = []

    def create(relpath: str, value: Any) -> None:
        if not raced:
            raced.append(relpath)
            CheckpointStore(make_storage(kind, tmp_path), owner="q1", run="run-b")
        real_create(relpath, value)

    storage.create_json = create  # type: ignore[method-assign]
    third = CheckpointStore(storage, owner="q1", run="run-c")
    assert raced == [claim_path(2)] and third.generation == 3
    with pytest.raises(FencedError, match="run run-a of query 'q1' was superseded"):
        first.complete(0, {})
    third.complete(0, {})


def test_removed_location_fences_the_writer(kind: str, tmp_path: Path) -> None:
    store = reopen(kind, tmp_path)
    shutil.rmtree(raw(tmp_path, ""))
    with pytest.raises(FencedError, match="lost its owner record"):
        store.complete(0, {})


def run_store(kind: str, root: Path, run: str | None) -> CheckpointStore:
    """An instance of ``run`` of query q1 (a driver's process opening the store)."""
    return CheckpointStore(make_storage(kind, root), owner="q1", run=run)


def test_an_instance_of_the_run_holding_the_claim_adopts_it(kind: str, tmp_path: Path) -> None:
    first = run_store(kind, tmp_path, "run-a")
    first.complete(0, {})
    again = run_store(kind, tmp_path, "run-a")  # the run's worker was replaced
    assert (again.generation, again.run) == (first.generation, "run-a") == (1, "run-a")
    again.complete(1, {})
    first.complete(2, {})  # same claim: neither fenced the other
    assert make_storage(kind, tmp_path).read_json(OWNER_RECORD)["generation"] == 1


def test_a_new_run_claims_anew_and_the_old_run_can_never_claim_back(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = run_store(kind, tmp_path, "run-a")
    old.complete(0, {})
    caplog.set_level(logging.INFO, logger="checkpointing.fencing")
    new = run_store(kind, tmp_path, "run-b")  # a restart, or a second driver
    assert new.generation == 2
    assert any("run run-a" in r.getMessage() and "fenced from now on" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(FencedError) as fenced:
        old.complete(1, {})
    message = str(fenced.value)
    assert "run run-a of query 'q1' was superseded" in message and "run run-b" in message
    assert "stop this driver" in message and "stop the newer one first" in message
    # the zombie's worker is replaced: it must not fence the live run back
    with pytest.raises(FencedError, match="may not claim the location again"):
        run_store(kind, tmp_path, "run-a")
    new.complete(1, {"by": "run-b"})
    record = make_storage(kind, tmp_path).read_json(OWNER_RECORD)
    assert (record["generation"], record["run"], record["superseded_runs"]) == (
        2, "run-b", ["run-a"])
    # a third run supersedes both
    third = run_store(kind, tmp_path, "run-c")
    assert third.generation == 3
    for zombie in ("run-a", "run-b"):
        with pytest.raises(FencedError):
            run_store(kind, tmp_path, zombie)
    third.complete(2, {})


def test_superseded_runs_are_bounded(kind: str, tmp_path: Path) -> None:
    from checkpointing.fencing import SUPERSEDED_KEPT

    for i in range(SUPERSEDED_KEPT + 3):
        run_store(kind, tmp_path, f"run-{i}")
    record = make_storage(kind, tmp_path).read_json(OWNER_RECORD)
    assert len(record["superseded_runs"]) == SUPERSEDED_KEPT
    assert record["superseded_runs"][-1] == f"run-{SUPERSEDED_KEPT + 1}"


def test_without_a_run_every_opening_claims_anew(kind: str, tmp_path: Path) -> None:
    a = run_store(kind, tmp_path, "run-a")
    plain = run_store(kind, tmp_path, None)
    assert plain.generation == 2
    assert run_store(kind, tmp_path, None).generation == 3
    with pytest.raises(FencedError):
        a.complete(0, {})
    assert run_store(kind, tmp_path, "run-b").generation == 4  # after a run-less claim


def test_an_owner_record_of_an_earlier_version_is_read(kind: str, tmp_path: Path) -> None:
    storage = make_storage(kind, tmp_path)
    storage.write_json(OWNER_RECORD, {"owner": "q1", "generation": 7, "token": "t",
                                      "claimed_ms": 1})
    store = run_store(kind, tmp_path, "run-a")
    assert store.generation == 8
    store.complete(0, {})


# -- random operation sequences ---------------------------------------------------------------

IDS = st.integers(0, 12)
STATES = st.dictionaries(st.sampled_from("abc"), st.integers(-3, 3), max_size=2)


class StoreMachine(RuleBasedStateMachine):
    """Random begin/complete/abort/reopen/crash sequences against a model of the store."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.retained: dict[int, dict[str, Any]] = {}  # completed id -> first recorded state
        self.latest: int | None = None
        self.pending: dict[int, dict[str, Any]] = {}
        self.last_retain = 0

    @initialize(kind=st.sampled_from(["local", "object"]), retain=st.integers(1, 4))
    def open(self, kind: str, retain: int) -> None:
        self.kind = kind
        self.retain = retain
        self.store = reopen(kind, self.root, retain=retain)

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _expect_refusal(self, checkpoint_id: int) -> type[Exception] | None:
        if checkpoint_id in self.retained:
            return AlreadyCompletedError
        if self.latest is not None and checkpoint_id < self.latest:
            return SubsumedError
        return None

    @rule(checkpoint_id=IDS, state=STATES)
    def begin(self, checkpoint_id: int, state: dict[str, Any]) -> None:
        refusal = self._expect_refusal(checkpoint_id)
        if refusal is not None:
            with pytest.raises(refusal):
                self.store.begin(checkpoint_id, state)
            return
        self.pending.setdefault(checkpoint_id, state)
        assert self.store.begin(checkpoint_id, state).state == self.pending[checkpoint_id]

    def _completed(self, checkpoint_id: int, state: dict[str, Any]) -> None:
        self.retained[checkpoint_id] = state
        self.latest = checkpoint_id
        self.pending = {i: s for i, s in self.pending.items() if i > checkpoint_id}
        self._apply_retention()

    def _apply_retention(self) -> None:
        self.retained = {i: self.retained[i] for i in sorted(self.retained)[-self.retain :]}
        self.last_retain = self.retain

    @rule(checkpoint_id=IDS, state=STATES)
    def complete(self, checkpoint_id: int, state: dict[str, Any]) -> None:
        if checkpoint_id in self.retained:
            assert self.store.complete(checkpoint_id, state).state == self.retained[checkpoint_id]
            self._apply_retention()  # a re-complete also finishes retention, with this retain
        elif self.latest is not None and checkpoint_id < self.latest:
            with pytest.raises(SubsumedError):
                self.store.complete(checkpoint_id, state)
        else:
            assert self.store.complete(checkpoint_id, state).state == state
            self._completed(checkpoint_id, state)

    @rule(checkpoint_id=IDS)
    def abort(self, checkpoint_id: int) -> None:
        if checkpoint_id in self.retained:
            with pytest.raises(AlreadyCompletedError):
                self.store.abort(checkpoint_id)
        else:
            self.store.abort(checkpoint_id)
            self.pending.pop(checkpoint_id, None)

    @rule(retain=st.integers(1, 4))
    def reopen(self, retain: int) -> None:
        old = self.store
        self.retain = retain
        self.store = reopen(self.kind, self.root, retain=retain)
        with pytest.raises(FencedError):
            old.abort(0)

    @rule(checkpoint_id=IDS, state=STATES, retry_state=STATES, step=st.integers(0, 6))
    def crash_then_replay(
        self, checkpoint_id: int, state: dict[str, Any], retry_state: dict[str, Any], step: int
    ) -> None:
        """complete() dies at some write; a new run replays the batch and completes again."""
        if self._expect_refusal(checkpoint_id) is not None:
            return
        try:
            with crash_at(self.store._storage, step):
                self.store.complete(checkpoint_id, state)
        except SimulatedCrash:
            self.store = reopen(self.kind, self.root, retain=self.retain)
            latest = self.store.latest_completed()
            assert (None if latest is None else latest.checkpoint_id) in (
                self.latest,
                checkpoint_id,
            )
            got = self.store.complete(checkpoint_id, retry_state)
            assert got.state in (state, retry_state)
            state = got.state
        self._completed(checkpoint_id, state)

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "store"):
            return
        latest = self.store.latest_completed()
        if self.latest is None:
            assert latest is None
        else:
            assert latest is not None
            assert latest.checkpoint_id == self.latest == max(self.retained)
            assert latest.state == self.retained[self.latest]
        assert self.store.completed_ids() == sorted(self.retained)
        assert len(self.retained) <= max(self.last_retain, 1)
        assert self.store.pending_ids() == sorted(self.pending)
        for i, state in self.retained.items():
            assert self.store.completed(i).state == state  # type: ignore[union-attr]


StoreMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_machine = StoreMachine.TestCase


def test_reader_reads_without_claiming_and_refuses_writes(storage: CheckpointStorage) -> None:
    owner = CheckpointStore(storage, owner="q1")
    owner.complete(3, {"x": 1})
    view = CheckpointStore.reader(storage)
    latest = view.latest_completed()
    assert latest is not None and latest.checkpoint_id == 3 and latest.state == {"x": 1}
    with pytest.raises(PermissionError, match="read-only"):
        view.complete(4, {})
    owner.complete(4, {"x": 2})  # the owner was not fenced by the reader
    assert view.completed_ids() == [3, 4]
