"""Named crash points for crash-injection tests.

``FLINKISH_FAILPOINT=<name>`` makes the process that reaches ``failpoint(<name>)`` write the
file named by ``FLINKISH_FAILPOINT_FILE`` and then block, so a test can SIGKILL the query's
whole process tree at exactly that point. Unset, a failpoint costs one dict lookup.
"""

from __future__ import annotations

import os
import time

ENV_NAME = "FLINKISH_FAILPOINT"
ENV_FILE = "FLINKISH_FAILPOINT_FILE"


def failpoint(name: str) -> None:
    if os.environ.get(ENV_NAME) != name:
        return
    path = os.environ.get(ENV_FILE)
    if path:
        with open(path, "w") as marker:
            marker.write(f"{name} {os.getpid()}\n")
    while True:  # wait to be killed
        time.sleep(1)
