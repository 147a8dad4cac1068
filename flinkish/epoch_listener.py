"""The session's listener that tells the driver-side readers, as soon as Spark has committed an
epoch, that it has, so a query's consumer group holds each epoch's end offsets right after it
(``flinkish_source.epoch_notices``): Spark posts a progress report after the epoch's commit.

It also explains Spark's refusal of a checkpoint of flinkish 0.1's window operator.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import weakref
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from flinkish.lag import end_offsets
from flinkish.windows import UNSUPPORTED_0_1
from flinkish_source.epoch_notices import send

log = logging.getLogger(__name__)
#: Spark's refusal of a checkpoint whose stateful operator is another one, and the operator
#: flinkish 0.1's windows ran in
OPERATOR_MISMATCH = "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
WINDOW_OPERATOR_0_1 = "transformWithStateInPySparkExec"

_lock = threading.Lock()
#: The classic sessions that have the listener (``register`` may be called again).
_listening: weakref.WeakSet[Any] = weakref.WeakSet()


class CompletedEpochListener(StreamingQueryListener):
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        send(end_offsets(json.loads(event.progress.json)))

    def onQueryTerminated(self, event: Any) -> None:
        error = event.exception or ""
        if OPERATOR_MISMATCH in error and WINDOW_OPERATOR_0_1 in error:
            log.error("query %s was restarted on a checkpoint of a transformWithState "
                      "operator; if its windows come from flinkish.windows.window(): %s",
                      event.id, UNSUPPORTED_0_1)


#: How long the driver's exit waits for Spark to deliver the events already posted (ms).
DRAIN_MS = 10_000


def listen(spark: Any) -> None:
    """Add the listener to a classic ``spark`` session, unless it has it already (a Connect
    session adds it once, in ``flinkish.connect.register_connect``)."""
    with _lock:
        if spark in _listening:
            return
        listener = CompletedEpochListener()
        spark.streams.addListener(listener)
        _listening.add(spark)
        atexit.register(_drain, weakref.ref(spark), listener)


def _drain(session: weakref.ref[Any], listener: CompletedEpochListener) -> None:
    """At the driver's exit: let Spark deliver the events posted (a query's last progress may
    come after ``awaitTermination`` returned), then remove the listener, which the JVM would
    otherwise log an error of for each event it can no longer deliver."""
    spark = session()
    if spark is None or spark.sparkContext._jsc is None:  # gone or stopped: nothing to deliver
        return
    context = spark.sparkContext._jsc
    # at exit, best effort: what does not arrive in time stays undelivered, and a session
    # stopping on its own may refuse the removal
    with contextlib.suppress(Exception):
        context.sc().listenerBus().waitUntilEmpty(DRAIN_MS)
    with contextlib.suppress(Exception):
        spark.streams.removeListener(listener)
