"""Durable, checksummed JSON records on local disk or any ``pyarrow.fs`` filesystem.

The source's watermark-generator state and the sink's per-epoch decisions must survive a
driver crash: every record is written atomically (a reader sees the old or the new value, never
a torn one) and carries a checksum (a damaged record is reported, never read as empty or older).
Local disk: temp file, fsync, rename, fsync of the directory; HDFS: temp file and move; object
stores: one PUT (docs/architecture.md, section 5).

Record format: one header line ``FLINKISH-RECORD <version> <payload length> <crc32 hex>``,
then the compact, key-sorted JSON payload (sorted so equal values give equal bytes).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import uuid
import zlib
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow.fs as pafs

from flinkish_core.locations import delete_file_if_present, filesystem_of, sync_local, sync_path

MAGIC = b"FLINKISH-RECORD"
VERSION = 1
TEMP_PREFIX = ".tmp-"
# A valid header is far shorter; a longer first line is not ours, not a truncated header.
_MAX_HEADER = 128


class CorruptRecordError(Exception):
    """A record exists but cannot be trusted: truncated, bad checksum, not ours, bad JSON."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"corrupt checkpoint record {path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickling passes only the message back to __init__; Spark may pickle errors.
        return (type(self), (self.path, self.problem))


def encode_record(value: Any) -> bytes:
    """The bytes of a record holding ``value`` (raises ValueError if it is not plain JSON)."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"value is not JSON-serialisable: {e}") from e
    payload = text.encode("utf-8")
    return b"%s %d %d %08x\n%s" % (MAGIC, VERSION, len(payload), zlib.crc32(payload), payload)


def decode_record(data: bytes, path: str) -> Any:
    """The value in record bytes ``data`` read from ``path``; CorruptRecordError if damaged."""
    prefix = MAGIC + b" "
    if not data:
        raise CorruptRecordError(path, "truncated: the file is empty")
    if not data.startswith(prefix):
        if prefix.startswith(data):
            raise CorruptRecordError(path, f"truncated: {len(data)} bytes, header incomplete")
        raise CorruptRecordError(
            path, f"not a flinkish record: expected header {MAGIC!r}, found {data[:24]!r}"
        )
    newline = data.find(b"\n", 0, _MAX_HEADER)
    if newline < 0:
        if len(data) < _MAX_HEADER:
            raise CorruptRecordError(path, f"truncated: {len(data)} bytes, header incomplete")
        raise CorruptRecordError(path, "malformed header: no end of line")
    fields = data[len(prefix) : newline].split(b" ")
    try:
        raw_version, raw_length, raw_crc = fields  # ValueError unless three
        version, length, crc = int(raw_version), int(raw_length), int(raw_crc, 16)
    except ValueError:
        raise CorruptRecordError(path, f"malformed header {data[:newline]!r}") from None
    if version != VERSION:
        raise CorruptRecordError(path, f"unsupported record version {version} (this is {VERSION})")
    payload = data[newline + 1 :]
    if len(payload) < length:
        raise CorruptRecordError(
            path, f"truncated: payload is {len(payload)} bytes, header says {length}"
        )
    if len(payload) > length:
        raise CorruptRecordError(
            path, f"{len(payload) - length} unexpected bytes after the {length}-byte payload"
        )
    actual = zlib.crc32(payload)
    if actual != crc:
        raise CorruptRecordError(
            path, f"bad checksum: header says {crc:08x}, payload has {actual:08x}"
        )
    try:
        return json.loads(payload.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CorruptRecordError(path, f"bad JSON: {e}") from e


def _s3_client_options(location: str) -> dict[str, str]:
    """boto3 client options for the S3 server and credentials a ``pyarrow.fs`` S3 URI names
    (``s3://key:secret@bucket/...``, ``endpoint_override``, ``scheme``, ``region``); what the URI
    leaves out comes from boto3's defaults, which read the same ``AWS_*`` variables as pyarrow."""
    parts = urlsplit(location)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    options: dict[str, str] = {}
    if "endpoint_override" in query:
        endpoint = query["endpoint_override"]
        if "://" not in endpoint:
            endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
        options["endpoint_url"] = endpoint
    if "region" in query:
        options["region_name"] = query["region"]
    if parts.username:
        options["aws_access_key_id"] = unquote(parts.username)
        options["aws_secret_access_key"] = unquote(parts.password or "")
    return options


def _display_uri(location: str) -> str:
    """``location`` without credentials, query or fragment, for error messages and logs."""
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}".rstrip("/")


class CheckpointStorage:
    """JSON records under one base directory of a filesystem, written atomically and durably
    (:meth:`open` builds it from a location string). Record paths are relative, with ``/``.
    ``rename_writes`` forces or forbids temp-and-rename writes on a non-local filesystem (by
    default only HDFS has them). One writer per record at a time."""

    def __init__(
        self, filesystem: pafs.FileSystem, base_path: str, *, location: str | None = None,
        rename_writes: bool | None = None, s3_client_options: dict[str, str] | None = None,
    ) -> None:
        self._fs = filesystem
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        if self._local:
            base_path = os.path.abspath(base_path)
        elif base_path != "/":
            base_path = base_path.rstrip("/")
        self._base = base_path
        self._rename = filesystem.type_name == "hdfs" if rename_writes is None else rename_writes
        self._s3_options = s3_client_options if filesystem.type_name == "s3" else None
        self._s3_client: Any = None
        if location is None:
            location = base_path if self._local else f"{filesystem.type_name}://{base_path}"
        self.location = location
        try:
            if self._local:
                os.makedirs(base_path, exist_ok=True)
            elif base_path not in ("", "/"):
                filesystem.create_dir(base_path, recursive=True)
        except OSError as e:
            raise ValueError(f"cannot create checkpoint location {location!r}: {e}") from e

    @classmethod
    def open(cls, location: str) -> CheckpointStorage:
        """Storage at a local path or a URI ``pyarrow.fs.FileSystem.from_uri`` understands
        (``file://``, ``s3://``, ``hdfs://``, ``gs://``...), creating the directory."""
        filesystem, path = filesystem_of(location, "checkpoint location")
        if isinstance(filesystem, pafs.LocalFileSystem):
            return cls(filesystem, path, location=path)
        return cls(
            filesystem, path, location=_display_uri(location),
            s3_client_options=_s3_client_options(location) if find_spec("boto3") else None,
        )

    def _path(self, relpath: str, *, allow_root: bool = False) -> str:
        if relpath == "" and allow_root:
            return self._base
        parts = relpath.split("/")
        if relpath.startswith("/") or "\\" in relpath or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"bad record path {relpath!r}: use 'dir/name', relative, no '..'")
        if parts[-1].startswith(TEMP_PREFIX):
            raise ValueError(f"bad record path {relpath!r}: {TEMP_PREFIX!r} names are reserved")
        return posixpath.join(self._base, relpath)

    def full_path(self, relpath: str) -> str:
        """Where ``relpath`` lives, for messages: an absolute path or a URI."""
        self._path(relpath, allow_root=True)
        root = self.location.rstrip("/") or "/"
        return posixpath.join(root, relpath) if relpath else root

    def _encode(self, relpath: str, value: Any) -> tuple[str, bytes]:
        path = self._path(relpath)
        try:
            return path, encode_record(value)
        except ValueError as e:
            raise ValueError(f"cannot write {self.full_path(relpath)}: {e}") from e

    def write_json(self, relpath: str, value: Any) -> None:
        """Atomically and durably replace the record at ``relpath`` with ``value``."""
        path, data = self._encode(relpath, value)
        if self._local:
            self._write_local(path, data)
        elif self._rename:
            self._write_renamed(path, data)
        else:
            self._put(path, data)

    @property
    def atomic_create(self) -> bool:
        """Whether of two :meth:`create_json` of one record at once exactly one succeeds:
        local disk (a hard link), and S3 with boto3 (a conditional PUT)."""
        return self._local or self._s3_options is not None

    def create_json(self, relpath: str, value: Any) -> None:
        """Write the record at ``relpath`` only if there is none (FileExistsError); atomic
        where :attr:`atomic_create` says so, check-then-write elsewhere."""
        path, data = self._encode(relpath, value)
        if self._local:
            self._write_local(path, data, replace=False)
        elif self._s3_options is not None:
            self._put_if_absent(path, data)
        elif self.exists(relpath):
            raise FileExistsError(f"{self.full_path(relpath)} exists")
        elif self._rename:
            self._write_renamed(path, data)
        else:
            self._put(path, data)

    def _write_local(self, path: str, data: bytes, replace: bool = True) -> None:
        directory, name = os.path.split(path)
        self._ensure_local_dir(directory)
        temp = os.path.join(directory, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(temp, path)
            else:
                os.link(temp, path)  # FileExistsError if the name exists, atomically
                os.unlink(temp)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        sync_local(directory)

    def _put_if_absent(self, path: str, data: bytes) -> None:
        """``If-None-Match: *``: S3 answers 412 if the key exists."""
        from botocore.exceptions import ClientError

        if self._s3_client is None:
            import boto3

            self._s3_client = boto3.client("s3", **self._s3_options or {})
        bucket, _, key = path.partition("/")
        try:
            self._s3_client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = e.response.get("Error", {}).get("Code")
            if status == 412 or code == "PreconditionFailed":
                raise FileExistsError(f"s3://{path} exists") from None
            raise OSError(f"conditional write of {path} failed: {code} ({status})") from None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_s3_client": None}  # a boto3 client does not pickle

    def _ensure_local_dir(self, directory: str) -> None:
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        self._ensure_local_dir(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        sync_local(parent)

    def _put(self, path: str, data: bytes) -> None:
        """One PUT; a directory made only when missing (object stores need none)."""
        try:
            with self._fs.open_output_stream(path) as out:
                out.write(data)
        except FileNotFoundError:
            self._fs.create_dir(posixpath.dirname(path), recursive=True)
            with self._fs.open_output_stream(path) as out:
                out.write(data)

    def _write_renamed(self, path: str, data: bytes) -> None:
        directory, name = posixpath.split(path)
        temp = posixpath.join(directory, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
        try:
            self._put(temp, data)
            self._fs.move(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                self._fs.delete_file(temp)
            raise

    def read_json(self, relpath: str) -> Any:
        """The value at ``relpath``: FileNotFoundError if absent, CorruptRecordError if damaged."""
        with self._fs.open_input_stream(self._path(relpath)) as f:
            data = f.read()
        return decode_record(data, self.full_path(relpath))

    def exists(self, relpath: str) -> bool:
        return bool(self._fs.get_file_info(self._path(relpath)).type == pafs.FileType.File)

    def _files(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
        return [i for i in self._fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def list(self, reldir: str) -> list[str]:
        """Sorted names of the records directly in ``reldir`` ("" is the base), temp files
        not; [] if absent."""
        names = (i.base_name for i in self._files(self._path(reldir, allow_root=True)))
        return sorted(n for n in names if not n.startswith(TEMP_PREFIX))

    def delete(self, relpath: str, durable: bool = True) -> None:
        """Remove the record at ``relpath``; nothing to do if it is absent. ``durable``: the
        removal survives a machine crash (a directory fsync); without, a crash may bring the
        record back, for callers to which a stale record is harmless."""
        self._delete(self._fs.delete_file, self._path(relpath), durable)

    def delete_dir(self, reldir: str) -> None:
        """Remove ``reldir`` and everything in it; nothing to do if it is absent."""
        self._delete(self._fs.delete_dir, self._path(reldir))

    def _delete(self, delete: Callable[[str], None], path: str, durable: bool = True) -> None:
        try:
            delete(path)
        except FileNotFoundError:
            return
        if durable:
            sync_path(self._fs, posixpath.dirname(path))

    def cleanup_temp(self, reldir: str = "", *, keep: tuple[str, ...] = ()) -> int:
        """Remove the temp files crashed writes left in ``reldir`` and below; how many. Only
        while no write runs there (it would fail) but of the records or directories in
        ``keep``, whose temp files are left alone."""
        found = self._files(self._path(reldir, allow_root=True), recursive=True)
        temps = [i.path for i in found
                 if i.base_name.startswith(TEMP_PREFIX) and not self._kept(i.path, keep)]
        for temp in temps:
            delete_file_if_present(self._fs, temp)
        for directory in {posixpath.dirname(t) for t in temps}:
            sync_path(self._fs, directory)
        return len(temps)

    def _kept(self, temp: str, keep: tuple[str, ...]) -> bool:
        """Whether ``temp``, ``<prefix><record name>-<random hex>``, is of a record in ``keep``."""
        directory, name = posixpath.split(temp)
        record = posixpath.join(directory, name[len(TEMP_PREFIX):].rpartition("-")[0])
        relpath = posixpath.relpath(record, self._base)
        return any(relpath == k or relpath.startswith(k + "/") for k in keep)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.location!r})"
