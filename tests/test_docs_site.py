"""The docs site stays true to the code: every example is run or marked with a reason, the
option tables list exactly the options the parsers accept, and every public name has a
docstring and a place in the API reference. (The examples themselves run in
integration/test_docs_examples.py; the site's links are checked by ``dev/docs.sh``.)"""

from __future__ import annotations

import inspect
import re

import pytest

import flinkish
from flinkish_sink import options as sink_options
from flinkish_source import options as source_options
from integration.doc_examples import ROOT, pages, problems

_NAME = re.compile(r"`([^`]+)`")


def option_table(page: str) -> set[str]:
    """The option names in the first column of a page's ``| Option |`` table."""
    lines = (ROOT / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Option |"))
    names = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.update(_NAME.findall(line.split("|")[1]))
    return names


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_runs_or_says_why_not(page: object) -> None:
    assert problems(page) == []  # type: ignore[arg-type]


def test_the_source_options_table_lists_exactly_the_options_the_source_accepts() -> None:
    accepted = {source_options._DISPLAY.get(key, key) for key in source_options._KNOWN}
    documented = option_table("docs/reference/source-options.md")
    # kafka.* is passed through; kafka.group.id is one of them with a meaning of its own
    assert documented - {"kafka.*", "kafka.group.id"} == accepted


def test_the_sink_options_table_lists_exactly_the_options_the_sink_accepts() -> None:
    assert option_table("docs/reference/sink-options.md") == set(sink_options._NAMES)


def test_every_public_name_has_a_docstring_and_a_place_in_the_api_reference() -> None:
    api = (ROOT / "docs/reference/api.md").read_text()
    for name in flinkish.__all__:
        value = getattr(flinkish, name)
        assert inspect.getdoc(value), f"flinkish.{name} has no docstring"
        where = value.__name__ if inspect.ismodule(value) else f"{value.__module__}.{name}"
        public = {"checkpointing", "flinkish_source.kafka"}  # errors re-exported by packages
        assert f"::: {where}" in api or any(f"::: {p}.{name}" in api for p in public), (
            f"docs/reference/api.md does not document flinkish.{name}")
    for name in flinkish.windows.__all__:
        assert inspect.getdoc(getattr(flinkish.windows, name)), f"windows.{name}: no docstring"
        assert re.search(rf"\b{name}\b", api), f"api.md does not document windows.{name}"
