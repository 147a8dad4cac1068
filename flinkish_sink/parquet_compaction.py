"""Compaction of a Parquet target: rewriting a query's small committed files into fewer large ones.

Flink's ``FileSink`` compacts before its commit; a micro-batch stream still makes one small
file per task and epoch, so here the driver merges *committed* files of completed epochs. The
steps, their crash safety and the reader's consistent view: docs/architecture.md, "Storage
layout of one query".
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from checkpointing.failpoints import failpoint
from flinkish_core.locations import delete_file_if_present, sync_path
from flinkish_sink.data_files import publish_file
from flinkish_sink.target import EPOCHS_DIR

logger = logging.getLogger(__name__)

COMPACTIONS_DIR = "_flinkish_compactions"
_STAGING = f"{COMPACTIONS_DIR}/_staging"
_SEP = "~"
#: a task attempt's part file (the epoch in the group)
_TASK_FILE = r"-(\d{9})-\d{5}-\d+-\d{3}\.parquet$"
#: a compaction's output (after its epoch)
_OUTPUT = re.compile(r"-c[0-9a-f]{8}-\d{3}\.parquet$")
#: the transactional part file of one task attempt, or a compaction's output
_PART = r"-(\d{9})-(?:\d{5}-\d+-\d{3}|c[0-9a-f]{8}-\d{3})\.parquet$"


@dataclass(frozen=True)
class Compaction:
    """One decided compaction: which files it replaces by which."""

    id: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_json(self) -> bytes:
        return json.dumps({"id": self.id, "inputs": list(self.inputs),
                           "outputs": list(self.outputs)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Compaction:
        parsed = json.loads(data)
        return cls(str(parsed["id"]), tuple(parsed["inputs"]), tuple(parsed["outputs"]))


def plan_groups(files: Iterable[tuple[str, int]], target_size: int) -> list[list[str]]:
    """Group ``files`` (name, bytes; in commit order) into runs of up to ``target_size`` bytes
    to merge; a file that large, or alone in its run, stays."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, length in files:
        if length >= target_size or (current and size + length > target_size):
            groups.append(current)
            current, size = [], 0
        if length < target_size:
            current.append(name)
            size += length
    groups.append(current)
    return [g for g in groups if len(g) > 1]


class Compactor:
    """Compacts the files of one query (``prefix``, ``query``) in the directory ``base``."""

    def __init__(self, fs: pafs.FileSystem, base: str, prefix: str, query: str,
                 target_size: int) -> None:
        self._fs = fs
        self._base = base
        self._prefix = prefix
        self._query = query
        self._target_size = target_size
        self._mine = re.compile(f"^part-{re.escape(prefix)}-{re.escape(query)}{_PART}")
        self._key = f"{prefix}{_SEP}{query}{_SEP}"

    def _path(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    def compact(self, epoch: int, fence: Callable[[], None] = lambda: None
                ) -> Compaction | None:
        """Finish any interrupted compaction, then merge the small files of epochs up to
        ``epoch``; ``fence`` (raising if another run took over) is called right before the
        record. What it decided (None: nothing)."""
        self.finish_pending(epoch)
        for record in self._records():  # all finished now
            delete_file_if_present(self._fs, self._path(COMPACTIONS_DIR, record))
        self._drop_undecided()
        files = sorted(  # in commit order: by epoch, then name
            ((m[1], info.base_name), info.size or 0) for info in self._listing()
            if (m := self._mine.match(info.base_name)) and int(m[1]) <= epoch)
        groups = plan_groups(((name, size) for (_, name), size in files), self._target_size)
        if not groups:
            return None
        token = uuid.uuid4().hex[:8]
        compaction_id = f"{self._key}{epoch:09d}{_SEP}{token}"
        staging = self._path(_STAGING, compaction_id)
        self._fs.create_dir(staging, recursive=True)
        outputs = [f"part-{self._prefix}-{self._query}-{epoch:09d}-c{token}-{n:03d}.parquet"
                   for n in range(len(groups))]
        for group, name in zip(groups, outputs, strict=True):
            self._merge(group, f"{staging}/{name}")
        sync_path(self._fs, staging)
        failpoint("compaction_staged", query=self._query, epoch=epoch)
        compaction = Compaction(compaction_id, tuple(n for g in groups for n in g),
                                tuple(outputs))
        fence()
        directory = self._path(COMPACTIONS_DIR)
        self._fs.create_dir(directory, recursive=True)
        publish_file(self._fs, f"{directory}/{compaction_id}.json", compaction.to_json())
        failpoint("compaction_decided", query=self._query, epoch=epoch)
        self._finish(compaction, epoch)
        logger.info("Parquet target %s: compacted %d files of query %s into %d",
                    self._base, len(compaction.inputs), self._query, len(outputs))
        return compaction

    def finish_pending(self, epoch: int) -> None:
        """Steps 3-4 of every decided compaction of this query (a no-op once done)."""
        for record in self._records():
            with self._fs.open_input_stream(self._path(COMPACTIONS_DIR, record)) as stream:
                self._finish(Compaction.from_json(stream.read()), epoch)

    def _finish(self, compaction: Compaction, epoch: int) -> None:
        staging = self._path(_STAGING, compaction.id)
        staged = [f"{staging}/{name}" for name in compaction.outputs]
        for name, source, info in zip(compaction.outputs, staged, self._fs.get_file_info(staged),
                                      strict=True):
            if info.type != pafs.FileType.NotFound:
                self._fs.move(source, self._path(name))
                failpoint("compaction_mid_move", query=self._query, epoch=epoch)
        missing = [name for name, info in zip(
            compaction.outputs,
            self._fs.get_file_info([self._path(n) for n in compaction.outputs]), strict=True)
            if info.type == pafs.FileType.NotFound]
        if missing:  # never delete the inputs of outputs that are gone
            raise RuntimeError(
                f"cannot finish compaction {compaction.id} in {self._base!r}: its outputs "
                f"{missing} are neither staged nor in place; they were removed outside "
                "flinkish (its inputs are kept)")
        sync_path(self._fs, self._base)
        failpoint("compaction_moved", query=self._query, epoch=epoch)
        for name in compaction.inputs:
            delete_file_if_present(self._fs, self._path(name))
        sync_path(self._fs, self._base)
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(staging)

    def _merge(self, inputs: list[str], output: str) -> None:
        """Stream the inputs' row groups into one file: memory holds one batch at a time."""
        writer: pq.ParquetWriter | None = None
        try:
            for name in inputs:
                source = pq.ParquetFile(self._path(name), filesystem=self._fs)
                if writer is None:
                    writer = pq.ParquetWriter(output, source.schema_arrow, filesystem=self._fs)
                for batch in source.iter_batches():
                    writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
        sync_path(self._fs, output)

    def _records(self) -> list[str]:
        selector = pafs.FileSelector(self._path(COMPACTIONS_DIR), allow_not_found=True)
        return sorted(i.base_name for i in self._fs.get_file_info(selector)
                      if i.is_file and i.base_name.startswith(self._key)
                      and i.base_name.endswith(".json"))

    def _drop_undecided(self) -> None:
        """Staging directories of compactions that crashed before their record."""
        selector = pafs.FileSelector(self._path(_STAGING), allow_not_found=True)
        for info in self._fs.get_file_info(selector):
            if info.type == pafs.FileType.Directory and info.base_name.startswith(self._key):
                with contextlib.suppress(FileNotFoundError):
                    self._fs.delete_dir(info.path)

    def _listing(self) -> list[pafs.FileInfo]:
        return [i for i in self._fs.get_file_info(pafs.FileSelector(self._base)) if i.is_file]


#: How often :func:`readable_files` lists the directory again while compactions change it.
VIEW_ATTEMPTS = 10


def readable_files(fs: pafs.FileSystem, base: str) -> list[str]:
    """The data files (paths) of a consistent view of ``base``: whole epochs, and each
    compaction's inputs or outputs, never both or neither. The order of the listings (epoch
    records, files, compaction records, files again) makes any interleaving with the query's
    commits and compactions give such a view (docs/architecture.md)."""
    base = base.rstrip("/")
    for _ in range(VIEW_ATTEMPTS):
        epochs = _epoch_records(fs, base)
        files = _data_files(fs, base)
        compactions = _compaction_records(fs, base)
        again = _data_files(fs, base)
        if files.keys() <= again.keys() and not any(
                _OUTPUT.search(name) for name in again.keys() - files.keys()):
            return _view(files, epochs, compactions)
    raise RuntimeError(
        f"cannot list a consistent view of {base!r}: its files were compacted while it was "
        f"listed, {VIEW_ATTEMPTS} times in a row (a listing slower than the compactions: "
        "raise parquet.compactEvery)")


def _epoch_records(fs: pafs.FileSystem, base: str) -> dict[str, set[int]]:
    """The epochs each query recorded (query -> epochs)."""
    epochs: dict[str, set[int]] = {}
    query_dirs = pafs.FileSelector(f"{base}/{EPOCHS_DIR}", allow_not_found=True)
    for info in fs.get_file_info(query_dirs):
        if info.type == pafs.FileType.Directory:
            records = fs.get_file_info(pafs.FileSelector(info.path))
            epochs[info.base_name] = {
                int(r.base_name[:-5]) for r in records
                if r.base_name.endswith(".json") and r.base_name[:-5].isdigit()}
    return epochs


def _data_files(fs: pafs.FileSystem, base: str) -> dict[str, str]:
    """The visible Parquet files (name -> path)."""
    return {i.base_name: i.path for i in fs.get_file_info(pafs.FileSelector(base))
            if i.is_file and i.base_name.endswith(".parquet")
            and not i.base_name.startswith(("_", "."))}


def _compaction_records(fs: pafs.FileSystem, base: str) -> list[Compaction]:
    """Every query's compaction records (one deleted meanwhile is left out)."""
    selector = pafs.FileSelector(f"{base}/{COMPACTIONS_DIR}", allow_not_found=True)
    compactions = []
    for info in fs.get_file_info(selector):
        if info.is_file and info.base_name.endswith(".json"):
            with contextlib.suppress(FileNotFoundError), fs.open_input_stream(info.path) as s:
                compactions.append(Compaction.from_json(s.read()))
    return compactions


def _view(files: dict[str, str], epochs: dict[str, set[int]],
          compactions: list[Compaction]) -> list[str]:
    hidden: set[str] = set()
    for compaction in compactions:
        done = all(name in files for name in compaction.outputs)
        hidden.update(compaction.inputs if done else compaction.outputs)
    for query, committed in epochs.items():
        task_file = re.compile(f"^part-.+-{re.escape(query)}{_TASK_FILE}")
        output = re.compile(f"^part-.+-{re.escape(query)}-(\\d{{9}}){_OUTPUT.pattern}")
        completed = max((int(m[1]) for name in files if (m := output.match(name))), default=-1)
        hidden.update(name for name in files if (m := task_file.match(name))
                      and int(m[1]) not in committed and int(m[1]) > completed)
    return sorted(path for name, path in files.items() if name not in hidden)
