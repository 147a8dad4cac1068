"""Killing a query's whole process tree, as a crash does.

PySpark's worker daemon leaves the driver's process group (``os.setpgid(0, 0)``), so killing
that group alone leaves workers running; the root starts a session of its own, and the session
is what gets killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

Stat = tuple[int, int, int, str]  # ppid, pgid, session, state


class ProcessError(RuntimeError):
    """Processes survived SIGKILL for longer than allowed."""


def _stat(pid: int) -> Stat | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0]


def _processes() -> dict[int, Stat]:
    table = {int(name): _stat(int(name)) for name in os.listdir("/proc") if name.isdigit()}
    return {pid: stat for pid, stat in table.items() if stat is not None}


def tree(root: int) -> dict[int, Stat]:
    """``root``, its descendants, and every process in its session; zombies left out."""
    table = _processes()
    found = {pid for pid, (_, _, sid, _) in table.items() if root in (pid, sid)}
    frontier = list(found)
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return {pid: table[pid] for pid in found if table[pid][3] != "Z"}


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_tree(root: int, timeout: float = 30.0, *, led_groups_only: bool = False) -> None:
    """SIGKILL ``root`` and everything it started (frozen first, so nothing forks meanwhile),
    its processes and their groups, then wait until all of it is gone. ``led_groups_only``:
    only groups led from the tree (an executor JVM is in its driver's group, which lives on)."""
    own_group = os.getpgrp()
    seen: dict[int, Stat] = {}
    for _ in range(10):
        found = tree(root)
        new = set(found) - set(seen)
        seen.update(found)
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        if not new:
            break
    groups = {pgid for _, pgid, _, _ in seen.values()} - {own_group}
    if led_groups_only:
        groups &= set(seen)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for pid in seen:
        _signal(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(root, 0)  # reap it if it is our child
    wait_gone(set(seen), groups, timeout)


def wait_gone(pids: set[int], groups: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive = sorted(pid for pid, (_, pgid, _, state) in _processes().items()
                       if state != "Z" and (pid in pids or pgid in groups))
        if not alive:
            return
        if time.monotonic() > deadline:
            raise ProcessError(f"processes {alive} still alive {timeout:g} s after SIGKILL")
        for pid in alive:  # stragglers forked into a killed group after the sweep
            _signal(pid, signal.SIGKILL)
        time.sleep(0.1)
