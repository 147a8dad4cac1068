"""Checkpoint records on S3 (a real S3-protocol server on loopback): atomic creation through
conditional writes, and fencing claims that two runs opening at once cannot both win."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from checkpointing import CheckpointStorage, CheckpointStore, FencedError
from checkpointing.fencing import claim_path
from integration.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

Storage = Callable[[], CheckpointStorage]


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A factory of fresh handles on one location (each run opens its own)."""
    if request.param == "local":
        return lambda: CheckpointStorage.open(str(tmp_path / "loc"))
    s3: S3Server = request.getfixturevalue("s3")
    bucket = f"ck-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    return lambda: CheckpointStorage.open(s3.uri(bucket, "query/flinkish"))


def test_creation_is_atomic_where_the_store_offers_it(storage: Storage, tmp_path: Path) -> None:
    assert storage().atomic_create
    subtree = CheckpointStorage(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()),
                                "other")
    assert not subtree.atomic_create  # check-then-write: the docs say so
    won: list[int] = []
    lost: list[int] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        handle = storage()
        start.wait()
        try:
            handle.create_json("r/once", {"by": i})
            won.append(i)
        except FileExistsError:
            lost.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert storage().read_json("r/once") == {"by": won[0]}
    with pytest.raises(FileExistsError):
        storage().create_json("r/once", {"by": "late"})


def test_of_runs_claiming_at_once_exactly_one_holds_the_location(storage: Storage) -> None:
    """Runs opening the store together each create a generation of their own, and only the
    newest may write (the others fail at once, or at their first write)."""
    opened: list[CheckpointStore] = []
    fenced: list[FencedError] = []
    start = threading.Barrier(6)

    def open_run(i: int) -> None:
        handle = storage()
        start.wait()
        try:
            opened.append(CheckpointStore(handle, owner="q1", run=f"run-{i}"))
        except FencedError as e:
            fenced.append(e)

    threads = [threading.Thread(target=open_run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    view = storage()
    claims = [view.read_json(claim_path(g)) for g in range(1, 7)]
    assert len({c["run"] for c in claims}) == 6 and not view.exists(claim_path(7))
    winners = []
    for store in opened:
        try:
            store.complete(store.generation, {})
            winners.append(store.run)
        except FencedError as e:
            fenced.append(e)
    assert winners == [claims[-1]["run"]] and len(fenced) == 5


def test_credentials_stay_out_of_locations_and_messages(s3: S3Server) -> None:
    bucket = f"ck-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    # pyarrow also takes the credentials in the URI: s3://key:secret@bucket/...
    uri = s3.uri(bucket, "q").replace("s3://", f"s3://{ACCESS_KEY}:{SECRET_KEY}@", 1)
    handle = CheckpointStorage.open(uri)
    handle.create_json("r", {"a": 1})
    with pytest.raises(FileExistsError) as caught:
        handle.create_json("r", {"a": 2})
    for text in (handle.location, repr(handle), str(caught.value)):
        assert SECRET_KEY not in text
