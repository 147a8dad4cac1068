"""``flinkish.register`` fails at once, naming the module, the interpreter and the fix, when
Spark's Python workers cannot import what flinkish's tasks need (a script run with a
virtualenv's interpreter while the workers start another one, with or without flinkish on its
path)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import flinkish

    spark = (SparkSession.builder.master("local[1]").appName("worker-python")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        flinkish.register(spark)
    except flinkish.WorkerEnvironmentError as exc:
        print("REFUSED:", exc)
        sys.exit(3)
    finally:
        spark.stop()
    print("REGISTERED")
""")


def test_register_names_the_worker_interpreter_that_cannot_import_flinkish(
    tmp_path: Path
) -> None:
    bare = getattr(sys, "_base_executable", "") or "python3"  # the virtualenv's base: no flinkish
    if subprocess.run([bare, "-c", "import flinkish"], cwd=tmp_path,
                      env={"PATH": os.environ["PATH"]}, capture_output=True).returncode == 0:
        pytest.skip(f"{bare} can import flinkish: no interpreter without it to test with")
    if subprocess.run([bare, "-c", "import pyarrow"], capture_output=True).returncode == 0:
        pytest.skip(f"{bare} has pyarrow: no half-working interpreter to test with")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = bare
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, (result.stdout, result.stderr[-3000:])
    message = result.stdout
    assert "flinkish: ModuleNotFoundError: No module named 'flinkish'" in message
    assert f"they run {os.path.realpath(bare)}" in message or f"they run {bare}" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message

    # run from inside the checkout, the same interpreter imports flinkish from the working
    # directory, but a read task would fail on pyarrow: register says so, not the read task
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, (result.stdout, result.stderr[-3000:])
    assert "pyarrow: ModuleNotFoundError: No module named 'pyarrow'" in result.stdout
    assert "PYSPARK_PYTHON" in result.stdout
    # (with workers that have everything it registers: every other integration test does)
