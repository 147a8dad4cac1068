"""MkDocs hooks: the parts of the docs site generated from the code and from data.

- ``<!-- cli-help -->`` in a page becomes each ``flinkish`` command's ``--help``, from the
  parser ``flinkish.cli`` runs, so the CLI reference cannot drift from it;
- ``<!-- sink-options -->`` becomes the sink's option reference and ``<!-- source-options -->``
  the source's, generated from the options' declarations (:mod:`flinkish_core.config`), so the
  reference lists exactly the options the parsers accept;
- ``<!-- benchmarks-latest -->`` becomes a table of each bench's latest figure in
  ``docs/benchmarks.csv``, and ``benchmarks.svg`` plots every figure of that file over time;
- the docstrings' Sphinx roles (``:func:`x```), which mkdocstrings leaves as text, become code.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

CLI_HELP = "<!-- cli-help -->"
SINK_OPTIONS = "<!-- sink-options -->"
SOURCE_OPTIONS = "<!-- source-options -->"
BENCHMARKS_LATEST = "<!-- benchmarks-latest -->"
BENCHMARKS_CSV = "benchmarks.csv"
BENCHMARKS_PLOT = "benchmarks.svg"
_SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|exc|obj):(?=<code>)")


def _cli_help() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    from flinkish.cli import build_parser

    parser = build_parser()
    parts = [f"```text\n{parser.format_help()}```\n"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts.append(f"### `flinkish {name}`\n\n```text\n{sub.format_help()}```\n")
    return "\n".join(parts)


def _benchmark_rows(docs_dir: str) -> list[dict[str, str]]:
    with open(Path(docs_dir) / BENCHMARKS_CSV, newline="") as f:
        return list(csv.DictReader(f))


def _latest_table(rows: list[dict[str, str]]) -> str:
    latest: dict[str, dict[str, str]] = {}
    for row in rows:  # the file is in time order: the last row of a bench is its latest
        latest[row["bench"]] = row
    lines = ["| Bench | Date | Figure | Value | Target | Conditions |", "|---|---|---|---|---|---|"]
    for bench, row in latest.items():
        lines.append(f"| `bench/{bench}.py` | {row['date']} | `{row['metric']}` | "
                     f"**{row['value']}** | {row['target'] or '—'} | {row['note']} |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, str]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = list(dict.fromkeys(row["bench"] for row in rows))
    fig, axes = plt.subplots(len(benches), 1, figsize=(8, 1.9 * len(benches)), squeeze=False)
    for ax, bench in zip(axes[:, 0], benches, strict=True):
        mine = [row for row in rows if row["bench"] == bench]
        ax.plot(range(len(mine)), [float(row["value"]) for row in mine], marker="o")
        ax.set_xticks(range(len(mine)), [row["date"][5:] for row in mine], fontsize=7)
        ax.set_title(f"bench/{bench}.py: {mine[-1]['metric']}", fontsize=9, loc="left")
        target = mine[-1]["target"].lstrip("<>=")
        if target:
            ax.axhline(float(target), color="grey", linestyle="--", linewidth=1)
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    return out.getvalue()


def on_files(files: Files, config: Any) -> Files:
    rows = _benchmark_rows(config["docs_dir"])
    files.append(File.generated(config, BENCHMARKS_PLOT, content=_plot(rows)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if CLI_HELP in markdown:
        markdown = markdown.replace(CLI_HELP, _cli_help())
    if SINK_OPTIONS in markdown:
        from flinkish_sink.options import reference

        markdown = markdown.replace(SINK_OPTIONS, reference())
    if SOURCE_OPTIONS in markdown:
        from flinkish_source.options import reference as source_reference

        markdown = markdown.replace(SOURCE_OPTIONS, source_reference())
    if BENCHMARKS_LATEST in markdown:
        rows = _benchmark_rows(config["docs_dir"])
        markdown = markdown.replace(BENCHMARKS_LATEST, _latest_table(rows))
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return _SPHINX_ROLE.sub("", html)
