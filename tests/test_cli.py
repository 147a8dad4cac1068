"""``flinkish``'s help is plain text with every option explained, and its commands refuse bad
input with a message that names the problem, before they start anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flinkish.cli import main


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys)
    assert "``" not in text and ":data:" not in text and "- ``" not in text  # no reST
    for command in ("demo", "dev", "inspect", "transactions"):
        assert re.search(rf"^\s+{command}\b", text, re.M), command


def _options_without_help(text: str) -> list[str]:
    """Option lines of argparse's help that carry no explanation: an option alone on its line
    with nothing indented under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("options:"))
    bare = []
    for i, line in enumerate(lines[start + 1:], start + 1):
        match = re.match(r"^  (-[-\w]+(?: [A-Z.\[\]:_{},a-z]+)?)\s*$", line)
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if match and not following.startswith(" " * 10):
            bare.append(match.group(1))
    return bare


@pytest.mark.parametrize("command", ["demo", "dev", "inspect", "transactions"])
def test_every_option_has_a_help_text(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = _help(capsys, command)
    assert _options_without_help(text) == [], text


def test_the_help_check_sees_an_option_without_help() -> None:
    text = "options:\n  -h, --help  show this\n  --table TABLE\n  --prefix PREFIX  the prefix\n"
    assert _options_without_help(text) == ["--table TABLE"]


def test_demo_target_and_transactions_flags_are_explained(
        capsys: pytest.CaptureFixture[str]) -> None:
    demo = " ".join(_help(capsys, "demo").split())
    assert "--target {parquet,postgres} where the sink writes" in demo
    txns = " ".join(_help(capsys, "transactions").split())
    for flag in ("--postgres DSN the sink's PostgreSQL target", "--parquet PATH the sink's",
                 "--table TABLE with --postgres", "--prefix PREFIX the sink's "
                 "transactionalIdPrefix"):
        assert flag in txns, flag


def test_inspect_a_missing_path_says_so_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "path"
    with pytest.raises(SystemExit) as done:
        main(["inspect", str(missing)])
    assert done.value.code == (
        f"flinkish inspect: {missing} does not exist: give the query's checkpointLocation "
        "(or the sink's store, its flinkish/ directory)")
    assert not (tmp_path / "no").exists()


def test_inspect_an_empty_directory_has_no_epochs(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no epochs recorded in" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["events:0", "events:x", ":3", "events:-1"])
def test_dev_refuses_a_bad_topic_before_starting_anything(spec: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(["dev", "--topic", spec])
    assert str(done.value.code).startswith(f"flinkish dev: --topic {spec!r} is not NAME or "
                                           "NAME:PARTITIONS")
