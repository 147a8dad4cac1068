"""A ``StreamingQueryListener`` made of functions: flinkish's listeners read only the progress
reports and the ends of queries."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def progress_listener(on_progress: Callable[[dict[str, Any]], None],
                      on_terminated: Callable[[str], None] | None = None) -> Any:
    """A listener handing ``on_progress`` each progress report (its JSON dict) and
    ``on_terminated`` the run id of each query that ends."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            on_progress(json.loads(event.progress.json))

        def onQueryTerminated(self, event: Any) -> None:
            if on_terminated is not None:
                on_terminated(str(event.runId))

    return ProgressListener()
