"""docs/architecture.md's module map stays true to the code: every module the product ships
appears in it, and every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The project's directories that hold no product code (the line count's rule too).
NOT_PRODUCT = {"tests", "integration", "bench", "dev", "docs"}


def product_modules() -> set[str]:
    """The product's modules: the Python files of the packages at the project's root (a
    package's ``__init__.py`` stands for the package, which the map's section rows name) and
    the top-level modules (``pyspark_flinkish.py``)."""
    modules = {path.name for path in ROOT.glob("*.py")}
    for package in (init.parent for init in ROOT.glob("*/__init__.py")
                    if init.parent.name not in NOT_PRODUCT):
        for path in package.rglob("*.py"):
            modules.add(path.relative_to(ROOT).as_posix())
    return modules


def mapped_modules() -> set[str]:
    """The files the module map's rows name in their first column."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Module map"):]
    table = table[:table.index("\n## ", 1)]
    named: set[str] = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            named |= set(re.findall(r"`([^`]+\.py)`", row.split("|")[1]))
    return named


def test_every_product_module_is_in_the_module_map() -> None:
    shipped = {m for m in product_modules() if not m.endswith("/__init__.py")}
    assert sorted(shipped - mapped_modules()) == []


def test_every_module_the_map_names_exists() -> None:
    assert sorted(m for m in mapped_modules() if not (ROOT / m).is_file()) == []
    assert sorted(mapped_modules() - product_modules()) == []
