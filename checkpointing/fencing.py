"""Fencing: one query, and one live run of it, writes a checkpoint location. The *owner* tells
two queries on one location apart, the *generation* a restarted query from its previous driver
still alive. Opening creates the claim ``_claims/<generation>`` (owner, random token), never
replaced; every write first checks that no newer claim exists and its own is still there. A
run (Spark's ``runId``) holding the claim adopts it; a run superseded may never claim again.
The rules and their reasons: docs/architecture.md, section 5.
"""

from __future__ import annotations

import logging
import re
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from checkpointing.checkpoint import now_ms
from checkpointing.storage import CheckpointStorage, CorruptRecordError

logger = logging.getLogger(__name__)

OWNER_RECORD = "_owner"
CLAIMS_DIR = "_claims"
#: Written by runs opening the location, even while another run holds it.
FENCING_RECORDS = (OWNER_RECORD, CLAIMS_DIR)
#: How many superseded runs a claim remembers (an older zombie is still fenced by the newer
#: claims); as many claim records are kept.
SUPERSEDED_KEPT = 64
#: Claims lost to another run opening at the same moment before giving up.
_CLAIM_ATTEMPTS = 16
_CLAIM_NAME = re.compile(r"[0-9]{12}")


def claim_path(generation: int) -> str:
    """Zero-padded: names sort as numbers."""
    return f"{CLAIMS_DIR}/{generation:012d}"


class FencedError(Exception):
    """This instance may not write the location: another query owns it, or a newer run of
    the same query has claimed it."""


@dataclass(frozen=True)
class Claim:
    """Who holds a location: the query, the generation, the random token, and the run, host
    and time of the claim."""

    owner: str
    generation: int
    token: str
    run: str | None = None
    host: str | None = None
    claimed_ms: int | None = None
    superseded: tuple[str, ...] = ()  # runs that held the location before, oldest first

    @classmethod
    def from_record(cls, record: Any, path: str) -> Claim:
        fields = record if isinstance(record, dict) else {}
        owner, generation, token = (fields.get(k) for k in ("owner", "generation", "token"))
        run, host, claimed = (fields.get(k) for k in ("run", "host", "claimed_ms"))
        superseded = fields.get("superseded_runs", [])
        if not (
            isinstance(owner, str)
            and isinstance(generation, int)
            and not isinstance(generation, bool)
            and isinstance(token, str)
            and isinstance(run, str | None)
            and isinstance(host, str | None)
            and (claimed is None or (isinstance(claimed, int) and not isinstance(claimed, bool)))
            and isinstance(superseded, list)
            and all(isinstance(r, str) for r in superseded)
        ):
            raise CorruptRecordError(path, "not an owner record")
        return cls(owner, generation, token, run, host, claimed, tuple(superseded))

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "owner": self.owner, "generation": self.generation, "token": self.token,
            "claimed_ms": self.claimed_ms, "host": self.host,
        }
        if self.run is not None:
            record["run"] = self.run
        if self.superseded:
            record["superseded_runs"] = list(self.superseded)
        return record

    def describe(self) -> str:
        """``generation 3 (run 1f2e…, claimed from host h at 2026-…Z)`` for messages."""
        where = []
        if self.run:
            where.append(f"run {self.run}")
        if self.host:
            where.append(f"claimed from host {self.host}")
        if self.claimed_ms is not None:
            when = datetime.fromtimestamp(self.claimed_ms / 1000, timezone.utc)
            where.append(f"at {when:%Y-%m-%d %H:%M:%S}Z")
        return f"generation {self.generation}" + (f" ({', '.join(where)})" if where else "")


class OwnerFence:
    """A claim on a location by one instance; :meth:`check` before every write."""

    def __init__(self, storage: CheckpointStorage, claim: Claim) -> None:
        self._storage = storage
        self.claim = claim

    @classmethod
    def acquire(cls, storage: CheckpointStorage, owner: str, run: str | None = None) -> OwnerFence:
        """Claim ``storage`` for ``owner`` with the next generation, or adopt the claim ``run``
        holds. FencedError if another query owns the location, or ``run`` was superseded."""
        for _ in range(_CLAIM_ATTEMPTS):
            current = _read_claim(storage)
            if current is not None and current.owner != owner:
                raise FencedError(_foreign(storage, owner, current.owner))
            if run is not None and current is not None:
                if current.run == run:
                    fence = cls(storage, current)
                    fence.check()
                    return fence
                if run in current.superseded:
                    raise FencedError(_superseded_run(storage, owner, run, current))
            claim = _next_claim(owner, run, current)
            record = claim.to_record()
            try:
                storage.create_json(claim_path(claim.generation), record)
            except FileExistsError:
                continue  # another run claimed this generation at the same moment: look again
            break
        else:
            raise FencedError(
                f"checkpoint location {storage.location!r}: query {owner!r} lost "
                f"{_CLAIM_ATTEMPTS} claims in a row to other runs opening at the same moment; "
                "more than one driver keeps starting this query -- run one"
            )
        storage.write_json(OWNER_RECORD, record)
        _prune_claims(storage, claim.generation)
        fence = cls(storage, claim)
        fence.check()  # read back: did a run opening at the same moment overwrite us?
        if current is not None and run is not None and current.run is not None:
            logger.info(
                "query %s claimed checkpoint location %s: %s; the previous holder, %s, is "
                "fenced from now on (if it still runs, it fails at its next write)",
                owner, storage.location, claim.describe(), current.describe(),
            )
        return fence

    def check(self) -> None:
        """Raise FencedError unless this instance's claim is still the current one."""
        storage, mine = self._storage, self.claim
        newer = claim_path(mine.generation + 1)
        if storage.exists(newer):
            self._superseded(_load_claim(storage, newer))
        try:
            current = _load_claim(storage, claim_path(mine.generation))
        except FileNotFoundError:
            if storage.exists(newer):  # claimed between our two looks
                self._superseded(_load_claim(storage, newer))
            raise FencedError(
                f"checkpoint location {storage.location!r} lost its owner record while query "
                f"{mine.owner!r} (generation {mine.generation}) was using it: the directory "
                "was removed or replaced; restart the query"
            ) from None
        if current.token != mine.token:  # a run that wrote the same generation after us
            self._superseded(current)

    def _superseded(self, current: Claim) -> None:
        mine, where = self.claim, self._storage.location
        if current.owner != mine.owner:
            raise FencedError(_foreign(self._storage, mine.owner, current.owner))
        if mine.run is not None and current.run is not None and current.run != mine.run:
            raise FencedError(_superseded_run(self._storage, mine.owner, mine.run, current))
        raise FencedError(
            f"checkpoint location {where!r}: this instance of query {mine.owner!r} "
            f"(generation {mine.generation}) was superseded by "
            f"{current.describe()}, a newer run of the same query; this instance is a "
            "zombie and must stop writing"
        )


def _next_claim(owner: str, run: str | None, current: Claim | None) -> Claim:
    """The claim that supersedes ``current`` (the next generation, a new token)."""
    generation = 1 if current is None else current.generation + 1
    superseded = list(current.superseded) if current is not None else []
    if current is not None and current.run is not None and current.run not in superseded:
        superseded.append(current.run)
    return Claim(
        owner, generation, uuid.uuid4().hex, run, _host(), now_ms(),
        tuple(superseded[-SUPERSEDED_KEPT:]),
    )


def _load_claim(storage: CheckpointStorage, relpath: str) -> Claim:
    return Claim.from_record(storage.read_json(relpath), storage.full_path(relpath))


def _claim_generations(storage: CheckpointStorage) -> list[int]:
    return sorted(int(n) for n in storage.list(CLAIMS_DIR) if _CLAIM_NAME.fullmatch(n))


def _prune_claims(storage: CheckpointStorage, generation: int) -> None:
    for old in _claim_generations(storage):
        if old <= generation - SUPERSEDED_KEPT:
            storage.delete(claim_path(old))


def _read_claim(storage: CheckpointStorage) -> Claim | None:
    """The newest claim; without one, the owner record (a 0.1 location's only record)."""
    generations = _claim_generations(storage)
    relpath = claim_path(generations[-1]) if generations else OWNER_RECORD
    try:
        return _load_claim(storage, relpath)
    except FileNotFoundError:
        return None


def _host() -> str | None:
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def _superseded_run(storage: CheckpointStorage, owner: str, run: str, current: Claim) -> str:
    return (
        f"checkpoint location {storage.location!r}: run {run} of query {owner!r} was "
        f"superseded by a newer run of the same query, now holding {current.describe()}; "
        "two drivers were running this query (or this one is a zombie of a restarted one), and "
        "the newer one wins. This run stops writing here and may not claim the location again. "
        "If the newer run is the one you want, stop this driver; if not, stop the newer one "
        "first, then start this query again (a new run claims the location anew)."
    )


def _foreign(storage: CheckpointStorage, owner: str, other: str) -> str:
    return (
        f"checkpoint location {storage.location!r} belongs to query {other!r}, not {owner!r}: "
        "use a different checkpointing.location, or remove the directory if the other query "
        "is gone"
    )
