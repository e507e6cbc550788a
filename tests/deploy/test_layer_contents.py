"""What ships to Lambda (the layer and the functions' code) is the service and nothing else.

The client, the CLI and the local stack are packages of their own (clients/, local_stack/): they
import the service, never the other way round. Everything the shipped code imports must be the
standard library, the service itself, or a distribution the layer's lock file pins; SAM installs
nothing else, so an import of click, tqdm, moto or PyYAML would fail only once deployed.
"""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LAYER = REPO / "layers" / "batch_core"
PACKAGE = LAYER / "freeinference_batch"
SHIPPED = [LAYER, REPO / "functions"]
# Development-side code and its dependencies, named so a failure says what crept in.
NEVER_SHIPPED = {"freeinference_batch_client", "freeinference_batch_local", "click", "tqdm", "moto", "werkzeug", "yaml"}


def shipped_modules() -> list[Path]:
    return sorted(path for root in SHIPPED for path in root.rglob("*.py"))


def imported_top_levels(path: Path) -> set[str]:
    """The top-level names `path` imports (relative imports stay inside its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def pinned_distributions() -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in (LAYER / "requirements.txt").read_text().splitlines())
    return {canonicalize_name(Requirement(line).name) for line in lines if line}


def test_the_layer_holds_the_service_package_and_its_requirements_only():
    # Beside the sources: caches, and the metadata `pip install -e .` writes into the first package
    # root (git-ignored, and no code).
    entries = {p.name for p in LAYER.iterdir()
               if not p.name.startswith(".") and p.name != "__pycache__" and not p.name.endswith(".egg-info")}
    assert entries == {"freeinference_batch", "requirements.in", "requirements.txt"}


def test_the_web_console_ships_with_its_function_not_in_the_layer():
    # The layer answers for a folder of files (console_site.py); the files are the console's own.
    assert not [p for p in LAYER.rglob("*") if p.suffix in {".html", ".js", ".css", ".svg"}]
    assert (REPO / "functions" / "console" / "static" / "index.html").is_file()


def test_the_client_cli_and_local_stack_are_not_in_the_service_package():
    for moved in ("local", "cli", "client.py", "openai_files.py"):
        assert not (PACKAGE / moved).exists(), f"{moved} belongs to clients/ or local_stack/, not the layer"


def test_shipped_code_imports_no_development_side_package():
    for path in shipped_modules():
        found = imported_top_levels(path) & NEVER_SHIPPED
        assert not found, f"{path.relative_to(REPO)} imports {sorted(found)}"


def test_every_import_of_shipped_code_is_stdlib_the_service_or_pinned_in_the_layer():
    pinned = pinned_distributions()
    providers = packages_distributions()
    for path in shipped_modules():
        for name in imported_top_levels(path) - set(sys.stdlib_module_names) - {"freeinference_batch"}:
            distributions = {canonicalize_name(d) for d in providers.get(name, [])}
            assert distributions & pinned, f"{path.relative_to(REPO)} imports {name}, which the layer does not pin"
