"""A Spark Connect server for the integration tests, in a process of its own.

A local Connect server is a classic SparkSession with the ``SparkConnectPlugin`` (what
``SparkSession.builder.remote("local[2]")`` starts inside the calling process, on the fixed port
15002). It cannot share a process with the test session's classic ``spark`` fixture (one
SparkContext per process, and ``remote(...)`` refuses to start beside one), and a Connect
client makes every later session of its process look remote to PySpark (``is_remote()`` reads an
environment variable). So the tests run the server here, on an ephemeral port, and each client
in a process of its own, with no JVM at all, as on a real deployment.

Protocol: the server prints ``{"port": N}`` once it listens, then answers one JSON request a line
on stdin with one JSON line on stdout; it stops when stdin closes.

- ``{"env": [user_id, session_id]}``: the keys of the environment map of the ``flinkish`` data
  source registered in that client session (``flinkish.session`` explains the map).
"""

from __future__ import annotations

import json
import sys
from typing import Any

CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def _service(spark: Any) -> Any:
    """The JVM's ``SparkConnectService`` object."""
    return getattr(getattr(spark._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$"),
                   "MODULE$")


def _env_keys(spark: Any, user_id: str, session_id: str) -> list[str]:
    jvm = spark._jvm
    service = _service(spark)
    key = jvm.org.apache.spark.sql.connect.service.SessionKey(user_id, session_id)
    holder = service.sessionManager().getIsolatedSessionIfPresent(key)
    if holder.isEmpty():
        raise LookupError(f"no Connect session {session_id} of user {user_id}")
    manager = holder.get().session().sessionState().dataSourceManager()
    env = manager.lookupDataSource("flinkish").dataSourceCls().envVars()
    return sorted(env.keySet())


def main() -> int:
    from flinkish.demo.spark_session import local_session

    spark = local_session(
        "flinkish-connect-server",
        **{
            "spark.plugins": CONNECT_PLUGIN,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",  # ephemeral: never another run's server
            # as on a Connect server started by remote(...)
            "spark.sql.artifact.isolation.enabled": "true",
        },
    )
    try:
        print(json.dumps({"port": _service(spark).localPort()}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            try:
                reply: dict[str, Any] = {"env": _env_keys(spark, *request["env"])}
            except Exception as exc:  # reported to the test, which fails on it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
