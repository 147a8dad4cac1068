"""Local files of one process (a task's spilled rows): in a directory of
its own, removed at exit, and removed by the next process that looks when its owner was
SIGKILLed (no exit handler ran)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

_directories: dict[tuple[int, str, str], str] = {}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def process_directory(prefix: str, base: str | None = None) -> str:
    """This process's directory named ``<prefix><pid>-…`` under ``base`` (the temp directory),
    mode 0700, created on first use; the ones of that prefix whose process is gone are
    removed first."""
    base = base or tempfile.gettempdir()
    key = (os.getpid(), prefix, base)
    if key not in _directories:
        with contextlib.suppress(OSError):
            for name in os.listdir(base):
                owner = name[len(prefix):].split("-", 1)[0]
                if name.startswith(prefix) and owner.isdigit() and not pid_alive(int(owner)):
                    shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        path = tempfile.mkdtemp(prefix=f"{prefix}{key[0]}-", dir=base)
        _directories[key] = path
        atexit.register(shutil.rmtree, path, True)
    return _directories[key]
