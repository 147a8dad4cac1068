"""An S3 server on loopback for the integration tests: moto's server mode in a child process.

Credentials reach pyarrow, boto3 and Spark's executors the way a user passes them on a cluster:
the ``AWS_*`` environment variables; location URIs carry only the endpoint (``endpoint_override``
and ``scheme``), never a secret.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from flinkish.demo.ports import free_port
from flinkish.demo.processes import kill_tree

REGION = "us-east-1"
ACCESS_KEY = "flinkish-test-key"
SECRET_KEY = "flinkish-test-secret-do-not-log"


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # host:port

    def uri(self, bucket: str, path: str = "") -> str:
        """A ``pyarrow.fs``-style location in ``bucket`` on this server."""
        where = f"{bucket}/{path.strip('/')}".rstrip("/")
        return f"s3://{where}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def create_bucket(self, bucket: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://{self.endpoint}", region_name=REGION)
        client.create_bucket(Bucket=bucket)


@contextlib.contextmanager
def s3_server(timeout: float = 30.0) -> Iterator[S3Server]:
    """Start moto's S3 server on a free loopback port, export the credentials, stop it after."""
    saved = {k: os.environ.get(k) for k in
             ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                      AWS_DEFAULT_REGION=REGION, AWS_REGION=REGION)
    port = free_port()
    # the server logs every request to stderr: into a file, as a pipe nobody reads fills up
    # after a few hundred requests and then blocks every request of the server for good
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed with the server, below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    stderr.seek(0)
                    err = stderr.read().decode(errors="replace")[-4000:]
                    raise RuntimeError(
                        f"the S3 server exited with {proc.returncode}: {err}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the S3 server did not answer within {timeout:.0f} s") from None
                time.sleep(0.1)
        yield S3Server(f"127.0.0.1:{port}")
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)
        stderr.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server
