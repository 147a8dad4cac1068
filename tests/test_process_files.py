"""A process's own local directory: private, one per process and prefix, and what SIGKILLed
processes left behind swept by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flinkish_core.process_files import pid_alive, process_directory


def test_directories_of_processes_that_are_gone_are_swept(tmp_path: Path) -> None:
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    assert not pid_alive(gone) and pid_alive(os.getpid())
    stale = tmp_path / f"px-{gone}-leftover"
    stale.mkdir()
    (stale / "key.pem").write_text("x")
    living = tmp_path / "px-1-theirs"  # pid 1 is alive
    living.mkdir()
    other = tmp_path / f"py-{gone}-another-prefix"
    other.mkdir()

    mine = process_directory("px-", str(tmp_path))
    assert not stale.exists() and living.exists() and other.exists()
    assert Path(mine).name.startswith(f"px-{os.getpid()}-")
    assert os.stat(mine).st_mode & 0o777 == 0o700
    assert process_directory("px-", str(tmp_path)) == mine
