"""The session's listener that tells the driver-side readers, as soon as Spark has committed an
epoch, that it has: so a query's consumer group holds each epoch's end offsets right after it,
whatever the trigger, and the last one of a query stopped with ``stop()`` too. The readers do
the committing (with the source's own Kafka settings, which never leave them); see
``flinkish_source.epoch_notices``.

Spark posts a query's progress after the epoch's commit log is written, so every end offset in
a progress report is of a committed epoch. ``flinkish.register`` adds the listener, once per
session; on a Spark Connect session it runs in a Python process of the server.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from flinkish.lag import end_offsets
from flinkish_source.epoch_notices import send

_lock = threading.Lock()
#: The classic sessions that have the listener (``register`` may be called again).
_listening: weakref.WeakSet[Any] = weakref.WeakSet()


class CompletedEpochListener(StreamingQueryListener):
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        send(end_offsets(json.loads(event.progress.json)))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def listen(spark: Any) -> None:
    """Add the listener to a classic ``spark`` session, unless it has it already (a Connect
    session adds it once, in ``flinkish.connect.register_connect``)."""
    with _lock:
        if spark in _listening:
            return
        spark.streams.addListener(CompletedEpochListener())
        _listening.add(spark)
