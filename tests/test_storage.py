"""CheckpointStorage: atomic, checksummed records on local disk and pyarrow filesystems."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from checkpointing import CheckpointStorage, CorruptRecordError
from checkpointing.storage import MAGIC, TEMP_PREFIX, encode_record

KINDS = ["local", "object", "renamed"]


def make_storage(kind: str, root: Path) -> CheckpointStorage:
    """Storage rooted at ``root/loc``: local disk (temp + fsync + rename), a non-local pyarrow
    filesystem written with single PUTs (as on S3), or one written with temp + move (HDFS)."""
    if kind == "local":
        return CheckpointStorage.open(str(root / "loc"))
    subtree = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    return CheckpointStorage(subtree, "loc", rename_writes=kind == "renamed")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage(kind: str, tmp_path: Path) -> CheckpointStorage:
    return make_storage(kind, tmp_path)


def raw(tmp_path: Path, relpath: str) -> Path:
    """The file behind ``relpath`` of a storage made by :func:`make_storage`."""
    return tmp_path / "loc" / relpath


VALUES: list[Any] = [
    {"epoch": 7, "partitions": {"0": 120, "1": -5}, "idle": [False, True]},
    [],
    {},
    "ünïcödé ✓",
    None,
    3.25,
    {"nested": {"deep": [1, [2, [3]], {"x": None}]}},
]


@pytest.mark.parametrize("value", VALUES)
def test_round_trip(storage: CheckpointStorage, value: Any) -> None:
    storage.write_json("dir/rec.json", value)
    assert storage.read_json("dir/rec.json") == value
    assert storage.exists("dir/rec.json")


def test_overwrite_replaces(storage: CheckpointStorage) -> None:
    storage.write_json("r", {"v": 1})
    storage.write_json("r", {"v": 2})
    assert storage.read_json("r") == {"v": 2}
    assert storage.list("") == ["r"]


def test_bytes_are_deterministic(storage: CheckpointStorage, tmp_path: Path) -> None:
    storage.write_json("a", {"b": 1, "a": [1, 2]})
    storage.write_json("b", {"a": [1, 2], "b": 1})
    assert raw(tmp_path, "a").read_bytes() == raw(tmp_path, "b").read_bytes()
    assert raw(tmp_path, "a").read_bytes().startswith(MAGIC + b" 1 ")


def test_missing_record(storage: CheckpointStorage) -> None:
    assert not storage.exists("nope")
    with pytest.raises(FileNotFoundError):
        storage.read_json("nope")
    with pytest.raises(FileNotFoundError):
        storage.read_json("no/such/dir")


def test_list_names_records_sorted(storage: CheckpointStorage, tmp_path: Path) -> None:
    assert storage.list("d") == []
    for name in ["b", "a", "c"]:
        storage.write_json(f"d/{name}", name)
    storage.write_json("d/sub/x", 1)
    (raw(tmp_path, "d") / f"{TEMP_PREFIX}a-123").write_bytes(b"partial")
    assert storage.list("d") == ["a", "b", "c"]
    assert storage.list("") == []


def test_delete_is_idempotent(storage: CheckpointStorage) -> None:
    storage.write_json("d/a", 1)
    storage.delete("d/a")
    storage.delete("d/a")
    storage.delete("never/was")
    assert not storage.exists("d/a")
    assert storage.list("d") == []


def test_delete_dir_is_recursive_and_idempotent(storage: CheckpointStorage) -> None:
    storage.write_json("d/a", 1)
    storage.write_json("d/e/f", 2)
    storage.write_json("keep", 3)
    storage.delete_dir("d")
    storage.delete_dir("d")
    assert storage.list("d") == []
    assert not storage.exists("d/e/f")
    assert storage.read_json("keep") == 3


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../b", "a//b", "./a", "a\\b", ".tmp-x"])
def test_bad_record_paths(storage: CheckpointStorage, bad: str) -> None:
    with pytest.raises(ValueError, match="bad record path"):
        storage.write_json(bad, 1)


@pytest.mark.parametrize("value", [{"x": object()}, {"x": float("nan")}, {("t",): 1}])
def test_value_must_be_json(storage: CheckpointStorage, value: Any) -> None:
    with pytest.raises(ValueError, match=r"cannot write .*rec: value is not JSON-serialisable"):
        storage.write_json("rec", value)
    assert not storage.exists("rec")


# -- corruption ----------------------------------------------------------------------------


def corrupt(storage: CheckpointStorage, tmp_path: Path, data: bytes) -> CorruptRecordError:
    """Replace record ``d/rec`` by ``data``, read it, and return the error it raised."""
    storage.write_json("d/rec", {"committed": [1, 2, 3], "watermark": 1000})
    raw(tmp_path, "d/rec").write_bytes(data)
    with pytest.raises(CorruptRecordError) as caught:
        storage.read_json("d/rec")
    error = caught.value
    assert error.path == storage.full_path("d/rec")
    assert error.path in str(error)
    assert str(tmp_path / "loc") in error.path or error.path.endswith("loc/d/rec")
    return error


GOOD = encode_record({"committed": [1, 2, 3], "watermark": 1000})


@pytest.mark.parametrize("cut", [0, 5, len(MAGIC) + 3, GOOD.index(b"\n") + 1, len(GOOD) - 1])
def test_truncated_record(storage: CheckpointStorage, tmp_path: Path, cut: int) -> None:
    error = corrupt(storage, tmp_path, GOOD[:cut])
    assert "truncated" in error.problem


def test_flipped_byte_is_bad_checksum(storage: CheckpointStorage, tmp_path: Path) -> None:
    data = bytearray(GOOD)
    data[-3] ^= 0x01
    assert "bad checksum" in corrupt(storage, tmp_path, bytes(data)).problem


def test_wrong_magic(storage: CheckpointStorage, tmp_path: Path) -> None:
    error = corrupt(storage, tmp_path, b'{"committed": [1, 2, 3]}')
    assert "not a flinkish record" in error.problem


def test_trailing_bytes(storage: CheckpointStorage, tmp_path: Path) -> None:
    assert "unexpected bytes" in corrupt(storage, tmp_path, GOOD + b"xx").problem


def test_unsupported_version(storage: CheckpointStorage, tmp_path: Path) -> None:
    data = GOOD.replace(MAGIC + b" 1 ", MAGIC + b" 9 ", 1)
    assert "unsupported record version 9" in corrupt(storage, tmp_path, data).problem


def test_malformed_header(storage: CheckpointStorage, tmp_path: Path) -> None:
    assert "malformed header" in corrupt(storage, tmp_path, MAGIC + b" x y z\n{}").problem
    assert "malformed header" in corrupt(storage, tmp_path, MAGIC + b" " * 200).problem


def test_bad_json_with_good_checksum(storage: CheckpointStorage, tmp_path: Path) -> None:
    payload = b"{not json"
    data = b"%s 1 %d %08x\n%s" % (MAGIC, len(payload), zlib.crc32(payload), payload)
    assert "bad JSON" in corrupt(storage, tmp_path, data).problem


def test_corrupt_error_pickles() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(CorruptRecordError("/x/y", "bad checksum")))
    assert (error.path, error.problem) == ("/x/y", "bad checksum")


# -- crashes between write and rename -------------------------------------------------------


def test_leftover_temp_is_ignored_and_cleaned(storage: CheckpointStorage, tmp_path: Path) -> None:
    storage.write_json("d/rec", {"v": "old"})
    storage.write_json("d/sub/other", 1)
    # A crash after writing the temp file, before the rename: a torn temp is left behind.
    (raw(tmp_path, "d") / f"{TEMP_PREFIX}rec-dead").write_bytes(encode_record({"v": "new"})[:9])
    (raw(tmp_path, "d/sub") / f"{TEMP_PREFIX}other-dead").write_bytes(b"")
    assert storage.read_json("d/rec") == {"v": "old"}
    assert storage.list("d") == ["rec"]
    assert storage.cleanup_temp("d") == 2
    assert sorted(os.listdir(raw(tmp_path, "d"))) == ["rec", "sub"]
    assert os.listdir(raw(tmp_path, "d/sub")) == ["other"]
    assert storage.cleanup_temp() == 0


def test_cleanup_leaves_the_temp_files_of_kept_records_alone(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Runs opening a location at the same moment write their claims while the holder cleans."""
    storage.write_json("_claims/1", 1)
    storage.write_json("d/rec", 1)
    (raw(tmp_path, "_claims") / f"{TEMP_PREFIX}2-0f0f").write_bytes(b"")
    (raw(tmp_path, "") / f"{TEMP_PREFIX}_owner-0f0f").write_bytes(b"")
    (raw(tmp_path, "") / f"{TEMP_PREFIX}_owner2-0f0f").write_bytes(b"")
    (raw(tmp_path, "d") / f"{TEMP_PREFIX}rec-0f0f").write_bytes(b"")
    assert storage.cleanup_temp(keep=("_owner", "_claims")) == 2
    assert sorted(p.name for p in raw(tmp_path, "").rglob(f"{TEMP_PREFIX}*")) == [
        f"{TEMP_PREFIX}2-0f0f", f"{TEMP_PREFIX}_owner-0f0f"]


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_local_crash_before_rename_keeps_old_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    storage = make_storage("local", tmp_path)
    storage.write_json("d/rec", {"v": "old"})

    def crash(*args: Any) -> None:
        raise OSError(f"simulated crash in {step}")

    monkeypatch.setattr(os, step, crash)
    with pytest.raises(OSError, match="simulated crash"):
        storage.write_json("d/rec", {"v": "new"})
    monkeypatch.undo()
    assert storage.read_json("d/rec") == {"v": "old"}
    assert os.listdir(raw(tmp_path, "d")) == ["rec"]  # the temp file went with the failure


class FailingMove:
    """A pyarrow filesystem whose ``move`` fails, like HDFS dying between write and rename."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def move(self, src: str, dest: str) -> None:
        raise OSError("simulated crash in move")


def test_renamed_crash_before_move_keeps_old_value(tmp_path: Path) -> None:
    make_storage("renamed", tmp_path).write_json("d/rec", {"v": "old"})
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    failing = CheckpointStorage(FailingMove(subtree), "loc", rename_writes=True)
    with pytest.raises(OSError, match="simulated crash in move"):
        failing.write_json("d/rec", {"v": "new"})
    assert failing.read_json("d/rec") == {"v": "old"}
    assert os.listdir(raw(tmp_path, "d")) == ["rec"]


def test_local_write_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make_storage("local", tmp_path)
    storage.write_json("d/rec", 1)  # creates d/ (and fsyncs the base)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    storage.write_json("d/rec", 2)
    assert len(synced) == 2  # the file's data, then the directory's rename


def test_object_store_writes_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make_storage("object", tmp_path)
    storage.write_json("d/rec", 1)
    created = []
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())

    class Recording(FailingMove):
        def open_output_stream(self, path: str) -> Any:
            created.append(path)
            return self._fs.open_output_stream(path)

    CheckpointStorage(Recording(subtree), "loc").write_json("d/rec", 2)
    assert created == ["loc/d/rec"]  # one PUT of the object itself, no temp, no move
    assert storage.read_json("d/rec") == 2


# -- opening ---------------------------------------------------------------------------------


def test_open_local_path_creates_it(tmp_path: Path) -> None:
    storage = CheckpointStorage.open(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    assert storage.location == str(tmp_path / "a" / "b")
    storage.write_json("x/y", 1)
    assert storage.full_path("x/y") == str(tmp_path / "a" / "b" / "x" / "y")


def test_open_relative_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    storage = CheckpointStorage.open("rel/loc")
    assert storage.location == str(tmp_path / "rel" / "loc")


def test_open_file_uri(tmp_path: Path) -> None:
    storage = CheckpointStorage.open((tmp_path / "u").as_uri())
    storage.write_json("r", [1])
    assert CheckpointStorage.open(str(tmp_path / "u")).read_json("r") == [1]
    assert storage.location == str(tmp_path / "u")


def test_open_non_local_uri() -> None:
    storage = CheckpointStorage.open("mock:///bucket/ckpt?opt=1#frag")
    assert storage.location == "mock:///bucket/ckpt"
    storage.write_json("d/r", {"a": 1})
    assert storage.read_json("d/r") == {"a": 1}
    assert storage.list("d") == ["r"]
    assert storage.full_path("d/r") == "mock:///bucket/ckpt/d/r"


def test_location_hides_credentials() -> None:
    storage = CheckpointStorage.open("mock://user:secret@/bucket/ckpt?access_key=k")
    assert storage.location == "mock:///bucket/ckpt"


def test_open_unknown_scheme_names_location() -> None:
    with pytest.raises(ValueError, match=r"cannot open checkpoint location 'nosuch://x/y'"):
        CheckpointStorage.open("nosuch://x/y")


def test_open_location_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"cannot create checkpoint location .*f'"):
        CheckpointStorage.open(str(tmp_path / "f"))


def test_open_empty_location() -> None:
    with pytest.raises(ValueError, match="empty"):
        CheckpointStorage.open(" ")
