"""Killing a query's whole process tree, as a crash does (see FACTS: pyspark's worker daemon
sets its own process group, so killing the driver's group alone leaves workers running)."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(pid: int, timeout: float = 30) -> None:
    """SIGKILL ``pid``, every descendant and every process group among them; wait until gone."""
    victims = [pid, *descendants(pid)]
    groups = set()
    for p in victims:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p))
    groups.discard(os.getpgid(0))
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for p in victims:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in victims):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {[p for p in victims if _alive(p)]} survived SIGKILL")
        time.sleep(0.05)
