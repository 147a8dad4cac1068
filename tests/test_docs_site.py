"""The docs site stays true to the code: every example is run or marked with a reason, the
option tables list exactly the options the parsers accept, and every public name has a
docstring and a place in the API reference. (The examples themselves run in
integration/test_docs_examples.py; the site's links are checked by ``dev/docs.sh``.)"""

from __future__ import annotations

import inspect
import re

import pytest

import flinkish
from flinkish_core.errors import OptionError
from flinkish_sink import options as sink_options
from flinkish_source import options as source_options
from integration.doc_examples import (
    ROOT,
    absolute_paths,
    blocks,
    flinkish_options,
    pages,
    problems,
    runnable_pages,
    shared_names,
)

_NAME = re.compile(r"`([^`]+)`")


def option_tables(text: str) -> set[str]:
    """The option names in the first column of every ``| Option |`` table of ``text``."""
    names: set[str] = set()
    rows = False
    for line in text.splitlines():
        rows = line.startswith("|") and (rows or line.startswith("| Option |"))
        if rows and not line.startswith(("| Option |", "|---")):
            names.update(_NAME.findall(line.split("|")[1]))
    return names


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_runs_or_says_why_not(page: object) -> None:
    assert problems(page) == []  # type: ignore[arg-type]


def test_the_pages_that_run_use_topics_tables_and_directories_of_their_own() -> None:
    """A reader runs the pages against one ``flinkish dev``: no page may write to another's
    table or checkpoint, or read its topic."""
    assert shared_names(runnable_pages()) == []


def test_the_pages_that_run_keep_their_checkpoints_in_the_readers_directory() -> None:
    """A page's checkpoints go under the directory it is run in, so running it again in a
    fresh directory starts fresh instead of resuming an earlier run that read everything."""
    assert absolute_paths(runnable_pages()) == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_that_do_not_run_give_flinkish_only_options_it_accepts(
    page: object,
) -> None:
    """A managed cluster's example, a lakehouse's: they need services CI does not start, but
    their option names are checked (and problems() checks that they compile)."""
    from flinkish_sink import targets

    declared = [*source_options.SOURCE_OPTIONS, *sink_options.SINK_OPTIONS,
                *(o for f in targets.installed() for o in f.options)]
    accepted = {key for o in declared for key in o.spellings()}
    prefixes = tuple(o.prefix.lower() for o in declared if o.prefix)
    for block in blocks(page):  # type: ignore[arg-type]
        if block.language == "python" and block.marker == "not run":
            unknown = [name for name in flinkish_options(block) if name.lower() not in accepted
                       and not name.lower().startswith(prefixes)]
            assert unknown == [], f"{block.where}: options flinkish does not accept"


def test_the_source_options_reference_is_generated_from_the_declarations() -> None:
    from dev.mkdocs_hooks import SOURCE_OPTIONS, on_page_markdown

    page = (ROOT / "docs/reference/source-options.md").read_text()
    assert SOURCE_OPTIONS in page and "| Option |" not in page  # no table kept by hand
    rendered = on_page_markdown(page, None, {}, None)  # type: ignore[arg-type]
    assert option_tables(rendered) == {o.key for o in source_options.SOURCE_OPTIONS}
    base = {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "checkpointing.location": "/s"}
    for option in source_options.SOURCE_OPTIONS:  # each documented option is one it reads
        try:
            source_options.parse_options({**base, option.key.replace("*", "x"): "?"})
        except OptionError as failure:
            assert "unknown option" not in str(failure), option.key


def test_the_sink_options_reference_is_generated_from_the_declarations() -> None:
    from dev.mkdocs_hooks import SINK_OPTIONS, on_page_markdown
    from flinkish_sink import targets

    page = (ROOT / "docs/reference/sink-options.md").read_text()
    assert SINK_OPTIONS in page and "| Option |" not in page  # no table kept by hand
    rendered = on_page_markdown(page, None, {}, None)  # type: ignore[arg-type]
    documented = option_tables(rendered)
    declared = [o for o in sink_options.SINK_OPTIONS] + [
        o for f in targets.installed() for o in f.options]
    assert documented == {o.key for o in declared}
    for factory in targets.installed():  # each documented option is one the parser reads
        assert f"- `{factory.name}`: " in rendered
        for option in factory.options:
            with pytest.raises(OptionError) as failure:
                sink_options.parse_sink_options({"target": factory.name, option.key: "?"})
            assert "unknown option" not in str(failure.value)


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
