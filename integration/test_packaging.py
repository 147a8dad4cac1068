"""What the install story (docs/guides/cluster-and-s3.md) promises: ``python -m build`` makes an
sdist and a wheel that ship to executors with everything Spark needs (the packages, the
``pyspark_flinkish`` module Spark discovers the format through), pure Python for every
platform, and installs from a checkout, normal or editable, print no setuptools warnings.
Integration: the builds run in isolated environments, so they need the package index that
setuptools comes from."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flinkish", "flinkish/demo", "flinkish_core", "checkpointing", "flinkish_kafka",
            "flinkish_source", "flinkish_sink")


def _run(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_build_makes_a_wheel_with_the_packages(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    # sdist first, then the wheel from the sdist: the wheel proves the sdist is complete too
    _run("-m", "build", "--outdir", str(out), str(ROOT))
    wheel = next(out.glob("flinkish-*.whl"))
    sdist = next(out.glob("flinkish-*.tar.gz"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
    assert "pyspark_flinkish.py" in names
    assert wheel.name.endswith("-py3-none-any.whl")  # pure Python: one wheel for every worker
    assert not any(n.startswith(("tests/", "integration/", "bench/")) for n in names)
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyspark_flinkish.py", "pyproject.toml"} <= members

    # the format's entry module and the packages load from the unpacked wheel
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    _run("-c", "import flinkish_source.stream_reader, pyspark_flinkish", cwd=unpacked)


def _setuptools_warnings(output: str) -> list[str]:
    """Lines of setuptools' warnings (the editable-install banner among them); pip's own notes
    about unusable index locations on this machine are not setuptools'."""
    return [line for line in output.splitlines()
            if ("Warning" in line or "!!" in line or "*****" in line)
            and "is ignored: it is neither a file nor a directory" not in line]


@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_installs_print_no_setuptools_warnings(tmp_path: Path, editable: bool) -> None:
    target = tmp_path / "site"
    output = _run("-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                  *(["-e"] if editable else []), str(ROOT))
    assert _setuptools_warnings(output) == [], output
    assert any(p.name.startswith("flinkish-") for p in target.glob("*.dist-info"))
