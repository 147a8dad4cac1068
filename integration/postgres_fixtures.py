"""The PostgreSQL server of an integration test session.

``$FLINKISH_POSTGRES_DSN`` selects an external server; otherwise one embedded server is started
for the whole session (initdb + start is ~1 s, too slow per test) and stopped at its end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flinkish.demo.embedded_postgres import postgres_for_tests


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    with postgres_for_tests() as dsn:
        yield dsn
