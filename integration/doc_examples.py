"""The code blocks of the README and the docs site, and how each is checked.

A fenced block either runs (``python`` in-process, in one namespace per page; ``bash`` as a
subprocess) or is marked, on the line right before it, with one of:

- ``<!-- not run: REASON -->``: shown only, for the reason given (a managed cluster's address);
- ``<!-- output -->``: the expected output of the last block that ran before it (doctest rules:
  ``...`` matches anything, whitespace is normalized).

A ``text``, ``mermaid`` or ``json`` block without a marker is a picture or a record, not an
example. Any other block without a marker is an error, so no example goes unchecked.

A page's examples are a complete program: ``integration/run_doc_pages.py`` runs them as written
against the ``flinkish dev`` command the page shows (a ``bash`` block of that one line, marked
not run since it runs until Ctrl-C), with nothing else defined. A page names its own topics,
tables and directories, so that pages run against one ``flinkish dev`` do not meet
(:func:`names`). A Python block that is not run still compiles.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from flinkish.demo.embedded_kafka import EXTERNAL_ENV
from flinkish.demo.embedded_postgres import DSN_ENV

ROOT = Path(__file__).resolve().parents[1]
#: What a page's examples may read of ``flinkish dev``: the variables of its ``export`` line.
DEV_ENV = (EXTERNAL_ENV, DSN_ENV)
RUNNABLE = ("python", "bash")
#: Not examples but pictures and data (a diagram, a JSON record, a directory tree): shown as is.
ILLUSTRATIONS = ("text", "mermaid", "json")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
_DEV = re.compile(r"^flinkish dev(?: --topic \S+)*$")
_TOPIC = re.compile(r"--topic (?P<name>[^\s:]+)")
#: An option naming a topic read, or what a page writes to: a table, or a directory (up to an
#: f-string's first field)
_NAMED = re.compile(r"""\.option\(\s*"(?P<key>subscribe|table|lateData\.table|path|"""
                    r"""lateData\.path|checkpointLocation|checkpointing\.location)"\s*,\s*"""
                    r"""f?"(?P<value>[^"{]*)""")
_FORMAT = re.compile(r'\.format\(\s*"([^"]+)"\s*\)')
_OPTION = re.compile(r'\.option\(\s*"(?P<key>[^"]+)"')
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not run|output)\s*(?::\s*(?P<arg>.*?))?\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None  # "not run", "output" or None
    argument: str  # the marker's reason or ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page whose examples must be checked: the README and the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = textwrap.dedent("\n".join(
            line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end]
        )) + "\n"
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        found.append(Block(
            page=str(page.relative_to(ROOT)), line=i + 1,
            language=(opening["info"].split() or [""])[0],
            code=code, marker=marker["kind"] if marker else None,
            argument=(marker["arg"] or "") if marker else "",
        ))
        i = end + 1
    return found


def dev_command(page: Path) -> str | None:
    """The ``flinkish dev`` line the page's examples run against, if it shows one."""
    commands = [b.code.strip() for b in blocks(page)
                if b.language == "bash" and _DEV.match(b.code.strip())]
    assert len(commands) <= 1, f"{page}: more than one flinkish dev line: {commands}"
    return commands[0] if commands else None


def names(page: Path) -> set[str]:
    """What the page's examples make in ``flinkish dev``'s broker and database and on disk:
    ``topic NAME``, ``table NAME`` and ``path PATH`` (a directory written to, up to an
    f-string's first field)."""
    found = {f"topic {m['name']}" for m in _TOPIC.finditer(dev_command(page) or "")}
    for block in blocks(page):
        if block.marker is None and block.language in RUNNABLE:
            for m in _NAMED.finditer(block.code):
                kind = {"subscribe": "topic", "table": "table"}.get(m["key"].split(".")[-1],
                                                                    "path")
                found.add(f"{kind} {m['value'].rstrip('/')}")
    return found


def shared_names(checked: list[Path]) -> list[str]:
    """Topics, tables or directories that two pages use (a directory inside another's
    counts), each with the two pages."""
    found = []
    named = [(page, name) for page in checked for name in sorted(names(page))]
    for i, (page, name) in enumerate(named):
        for other, other_name in named[i + 1:]:
            if page == other:
                continue
            nested = name.startswith("path ") and other_name.startswith("path ") and (
                f"{other_name}/".startswith(f"{name}/") or f"{name}/".startswith(f"{other_name}/"))
            if name == other_name or nested:
                found.append(f"{page.relative_to(ROOT)} and {other.relative_to(ROOT)} both use "
                             f"{name if len(name) <= len(other_name) else other_name}")
    return found


def absolute_paths(checked: list[Path]) -> list[str]:
    """Directories pages write to by an absolute path: the page's run keeps them between
    runs (a checkpoint left by an earlier run makes the next one read nothing), where a path
    relative to the directory the reader runs in starts fresh with it."""
    return [f"{page.relative_to(ROOT)} writes to {name[len('path '):]}"
            for page in checked for name in sorted(names(page))
            if name.startswith("path /")]


def flinkish_options(block: Block) -> list[str]:
    """The option names a Python block gives ``format("flinkish")``, the source's or the
    sink's (those after it, up to the next ``format``)."""
    found = []
    parts = _FORMAT.split(block.code)  # code, name, code, name, code...
    for name, code in zip(parts[1::2], parts[2::2], strict=True):
        if name == "flinkish":
            found += [m["key"] for m in _OPTION.finditer(code)]
    return found


def problems(page: Path) -> list[str]:
    """What is wrong with a page's blocks: unmarked blocks that cannot run, examples that read
    ``flinkish dev``'s variables on a page that does not show the command, ``not run`` markers
    without their reason, Python blocks not run that do not compile, output blocks with
    nothing before them."""
    found = []
    ran = False
    if dev_command(page) is None and any(
            name in block.code for block in blocks(page) if block.marker is None
            for name in DEV_ENV):
        found.append(f"{page.relative_to(ROOT)}: its examples read flinkish dev's variables: "
                     "show the command they run against (```bash flinkish dev --topic ...)")
    for block in blocks(page):
        if block.marker is None:
            if block.language in ILLUSTRATIONS:
                continue
            if block.language not in RUNNABLE:
                found.append(f"{block.where}: a ```{block.language} block runs nowhere: make it "
                             "python or bash, or mark it <!-- not run: REASON -->")
            ran = True
        elif block.marker == "not run":
            if not block.argument:
                found.append(f"{block.where}: <!-- not run --> needs a reason after a colon")
            try:
                if block.language == "python":
                    compile(block.code, block.where, "exec")
            except SyntaxError as error:
                found.append(f"{block.where}: does not compile: {error}")
        elif block.marker == "output" and not ran:
            found.append(f"{block.where}: <!-- output --> follows no block that runs")
    return found


def runnable_pages() -> list[Path]:
    return [page for page in pages()
            if any(b.marker is None and b.language in RUNNABLE for b in blocks(page))]
