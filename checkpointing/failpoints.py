"""Named crash points for crash-injection tests.

Armed, the process that reaches a matching ``failpoint(name, query=…, epoch=…)`` writes a
marker file and blocks, so a test can SIGKILL the query at exactly that point; unarmed, a
failpoint costs one environment lookup. ``FLINKISH_FAILPOINTS`` names a JSON file of points::

    [{"point": "mid_commit", "marker": "/tmp/case/fired",
      "checkpoint": "/tmp/case/checkpoint",   # or "query": "<query id>"; neither: any query
      "from_epoch": 1,                         # fire only in epochs >= 1 (default 0)
      "min_transactions": 1,                   # only where the caller says it holds >= 1
      "once": true}]                           # only the first process to get there stops

With ``"once"`` the task Spark reruns after a test killed the stopped one runs through.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from checkpointing.query import query_id

ENV = "FLINKISH_FAILPOINTS"

_specs: dict[str, list[dict[str, Any]]] = {}


def _armed(path: str) -> list[dict[str, Any]]:
    if path not in _specs:
        with open(path, encoding="utf-8") as f:
            specs = json.load(f)
        if not isinstance(specs, list) or not all(
            isinstance(s, dict) and "point" in s and "marker" in s for s in specs
        ):
            raise ValueError(f"{ENV}={path}: expected a list of {{point, marker, ...}} objects")
        _specs[path] = specs
    return _specs[path]


def _matches(spec: dict[str, Any], query: str, epoch: int, transactions: int | None) -> bool:
    if epoch < int(spec.get("from_epoch", 0)):
        return False
    if "min_transactions" in spec and (
            transactions is None or transactions < int(spec["min_transactions"])):
        return False
    if "query" in spec:
        return bool(spec["query"] == query)
    if "checkpoint" in spec:
        try:
            return query_id(spec["checkpoint"]) == query
        except ValueError:  # the query has not written its metadata yet
            return False
    return True


def failpoint(name: str, *, query: str, epoch: int, transactions: int | None = None) -> None:
    """Block here if a test armed point ``name`` for this query and epoch (and, where the
    caller says how many transactions its step holds, ``transactions``: a decision's)."""
    path = os.environ.get(ENV)
    if not path:
        return
    for spec in _armed(path):
        if spec["point"] == name and _matches(spec, query, epoch, transactions):
            try:
                marker = open(spec["marker"], "x" if spec.get("once") else "w",  # noqa: SIM115
                              encoding="utf-8")
            except FileExistsError:  # "once", and another process got here first
                continue
            with marker:
                marker.write(f"{name} {os.getpid()}\n")
            while True:  # wait to be killed
                time.sleep(1)
