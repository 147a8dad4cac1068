"""Fencing: one query, and one live run of it, writes a checkpoint location.

Two checks, because they catch different mistakes:

* **owner** -- two *different* queries configured with the same location would mix their
  epochs (both have a batch 7) and recover each other's state. The owner is stable across
  restarts, so a generation alone could not tell "my previous run" from "someone else"; and it
  gives a message the user can act on.
* **generation** -- the *same* query restarted while its previous driver is still alive (a
  zombie after a failover or an application-master retry) must not keep writing decisions
  over the ones the new run recovered. Both runs carry the same owner, so only a per-run
  generation tells them apart.

Each writing instance claims the location when it opens: it writes the owner record with the
next generation and a random token, then reads it back. Every later write first checks the
record still names its generation and token. Plain filesystems have no compare-and-swap, so
two runs opening at the very same moment can both write; the token (not the generation
number, which both may have chosen) makes the loser fail at its read-back or its first write.
A zombie that passed its check just before a new run claimed the location can still finish
that one write: fencing narrows the window to one operation, it cannot close it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from checkpointing.checkpoint import now_ms
from checkpointing.storage import CheckpointStorage, CorruptRecordError

OWNER_RECORD = "_owner"


class FencedError(Exception):
    """This instance may not write the location: another query owns it, or a newer run of
    the same query has claimed it."""


@dataclass(frozen=True)
class Claim:
    """Who holds a location: the query, the run's generation and the run's random token."""

    owner: str
    generation: int
    token: str

    @classmethod
    def from_record(cls, record: Any, path: str) -> Claim:
        fields = record if isinstance(record, dict) else {}
        owner, generation, token = (fields.get(k) for k in ("owner", "generation", "token"))
        if not (
            isinstance(owner, str)
            and isinstance(generation, int)
            and not isinstance(generation, bool)
            and isinstance(token, str)
        ):
            raise CorruptRecordError(path, "not an owner record")
        return cls(owner, generation, token)


class OwnerFence:
    """A claim on a location by one instance; :meth:`check` before every write."""

    def __init__(self, storage: CheckpointStorage, claim: Claim) -> None:
        """Use :meth:`acquire`; this only wraps a claim already written."""
        self._storage = storage
        self.claim = claim

    @classmethod
    def acquire(cls, storage: CheckpointStorage, owner: str) -> OwnerFence:
        """Claim ``storage`` for ``owner`` with the next generation, fencing earlier runs.

        Raises FencedError if another query owns the location."""
        current = _read_claim(storage)
        if current is not None and current.owner != owner:
            raise FencedError(_foreign(storage, owner, current.owner))
        generation = 1 if current is None else current.generation + 1
        claim = Claim(owner, generation, uuid.uuid4().hex)
        storage.write_json(
            OWNER_RECORD,
            {
                "owner": owner,
                "generation": generation,
                "token": claim.token,
                "claimed_ms": now_ms(),
            },
        )
        fence = cls(storage, claim)
        fence.check()  # read back: did a run opening at the same moment overwrite us?
        return fence

    def check(self) -> None:
        """Raise FencedError unless this instance's claim is still the current one."""
        current = _read_claim(self._storage)
        where = self._storage.location
        mine = self.claim
        if current is None:
            raise FencedError(
                f"checkpoint location {where!r} lost its owner record while query "
                f"{mine.owner!r} (generation {mine.generation}) was using it: the directory "
                "was removed or replaced; restart the query"
            )
        if current.owner != mine.owner:
            raise FencedError(_foreign(self._storage, mine.owner, current.owner))
        if (current.generation, current.token) != (mine.generation, mine.token):
            raise FencedError(
                f"checkpoint location {where!r}: this instance of query {mine.owner!r} "
                f"(generation {mine.generation}) was superseded by generation "
                f"{current.generation}, a newer run of the same query; this instance is a "
                "zombie and must stop writing"
            )


def _read_claim(storage: CheckpointStorage) -> Claim | None:
    try:
        record = storage.read_json(OWNER_RECORD)
    except FileNotFoundError:
        return None
    return Claim.from_record(record, storage.full_path(OWNER_RECORD))


def _foreign(storage: CheckpointStorage, owner: str, other: str) -> str:
    return (
        f"checkpoint location {storage.location!r} belongs to query {other!r}, not {owner!r}: "
        "use a different checkpointing.location, or remove the directory if the other query "
        "is gone"
    )
