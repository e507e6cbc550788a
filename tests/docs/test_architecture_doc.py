"""docs/ARCHITECTURE.md names every module of each package (the layer's, the client's and the local
stack's) in its module table, and every top-level entry of the repository in its layout table: a
newcomer reads there where things live, so a module or file added without a line there fails here."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "layers/batch_core/freeinference_batch"
CLIENT_PACKAGE = REPO / "clients/freeinference_batch_client"
LOCAL_PACKAGE = REPO / "local_stack/freeinference_batch_local"
DOC = REPO / "docs/ARCHITECTURE.md"


def table(heading: str) -> list[tuple[list[str], str]]:
    """(the backticked names of the first cell, the rest of the row) of each row of the table
    under `heading`."""
    text = DOC.read_text()
    assert heading in text, f"{DOC.name} has no section {heading!r}"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        first, _, rest = line.strip("|").partition("|")
        rows.append((re.findall(r"`([^`]+)`", first), rest))
    return rows


def modules_of(package: Path) -> set[str]:
    """The package's module paths relative to it (`x.py`, `sub/y.py`), `__init__.py` aside."""
    return {str(path.relative_to(package)) for path in package.rglob("*.py") if path.name != "__init__.py"}


def named_modules() -> set[str]:
    """Module paths relative to the package the module table names: `x.py` in the first cell, or
    `y.py` named in the row of a sub-package `sub/` (as `sub/y.py`)."""
    names = set()
    for first, rest in table("## Package `freeinference_batch`"):
        for name in first:
            if name.endswith("/"):
                names.update(name + module for module in re.findall(r"`([\w]+\.py)`", rest))
            names.add(name)
    return names


def test_the_module_table_names_every_module_of_the_layer():
    modules = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    assert len(modules) > 30
    missing = sorted(modules - named_modules())
    assert not missing, f"modules of the layer that docs/ARCHITECTURE.md's module table does not name: {missing}"


def holds_code(path: Path) -> bool:
    """False for a module that is only a docstring (a package's `__init__.py` that names it)."""
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
               for node in ast.parse(path.read_text()).body)


def test_the_client_table_names_every_module_of_the_client_package_one_a_row():
    modules = {str(path.relative_to(CLIENT_PACKAGE)) for path in CLIENT_PACKAGE.rglob("*.py") if holds_code(path)}
    assert {"client.py", "cli/__init__.py", "cli/user.py"} <= modules
    rows = [first for first, _ in table("## Package `freeinference_batch_client`")]
    named = {name for first in rows for name in first if name.endswith(".py")}
    missing = sorted(modules - named)
    assert not missing, f"modules of the client that docs/ARCHITECTURE.md's client table does not name: {missing}"
    gone = sorted(name for name in named if not (CLIENT_PACKAGE / name).is_file())
    assert not gone, f"docs/ARCHITECTURE.md's client table names modules that do not exist: {gone}"
    shared = [first for first in rows if len(first) > 1]
    assert not shared, f"rows of the client table that name more than one module: {shared}"


def test_the_local_stack_table_names_every_module_of_the_local_stack_one_row_each():
    modules = modules_of(LOCAL_PACKAGE)
    assert len(modules) > 30
    named = [name for first, _ in table("## Package `freeinference_batch_local` (`local_stack/`)") for name in first]
    missing = sorted(modules - set(named))
    assert not missing, f"local-stack modules docs/ARCHITECTURE.md's local-stack table does not name: {missing}"
    # One row per module, named by its path in the package, and no row for a module that is gone
    assert sorted(named) == sorted(modules), f"rows that name no module or name one twice: {sorted(named)}"


def test_the_layout_table_names_every_top_level_entry_of_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    entries = {path.split("/", 1)[0] for path in tracked.splitlines()} - {""}
    entries = {entry for entry in entries if not entry.startswith(".")}
    named = {name.split("/", 1)[0] for first, _ in table("## Layout") for name in first}
    missing = sorted(entries - named)
    assert not missing, f"top-level entries docs/ARCHITECTURE.md's layout table does not name: {missing}"
