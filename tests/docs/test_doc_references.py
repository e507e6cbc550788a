"""The docs stand on their own in a plain clone, and what they point at is there.

A clone has no `../shared/` (the user guide and openapi.yaml are the contract it carries), so no
doc sends a reader there; every relative link resolves; every file or folder a doc names by its
repository path exists, and every module it names by its file name alone (a moved or renamed
module's old name is caught here); and README's configuration table names every setting
`Settings` reads.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from freeinference_batch.core.settings import Settings

from tests.docs.repo_paths import REPO, SERVICE, backticked, found_at, looks_like_path

DOCS = [REPO / "README.md", REPO / "docs/ARCHITECTURE.md", REPO / "docs/USER_GUIDE.md", REPO / "bench/README.md"]
# A path is checked when it starts where the repository's files do: a top-level folder, a package,
# or a folder of the service package (the docs name the service's modules from inside it).
FIRST_SEGMENTS = {
    *(path.name for path in REPO.iterdir() if path.is_dir() and not path.name.startswith(".")),
    "freeinference_batch", "freeinference_batch_client", "freeinference_batch_local",
    *(path.name for path in SERVICE.iterdir() if path.is_dir() and not path.name.startswith("__")),
}


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("doc", [*DOCS, REPO / "openapi.yaml"], ids=_id)
def test_no_doc_sends_a_reader_outside_the_clone(doc: Path) -> None:
    text = doc.read_text()
    for outside in ("../shared", "shared/spec", "shared/DESIGN", "docs/DESIGN"):
        assert outside not in text, f"{_id(doc)} refers to {outside}, which a clone does not have"


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_relative_link_resolves(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        assert path.exists() and REPO in path.parents, f"{_id(doc)} links to {target}, which is not in the repository"


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_repository_path_a_doc_names_exists(doc: Path) -> None:
    named = {name for name in backticked(doc.read_text())
             if looks_like_path(name) and "/" in name and name.split("/", 1)[0] in FIRST_SEGMENTS}
    assert named
    missing = sorted(name for name in named if not found_at(name))
    assert not missing, f"{_id(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_module_a_doc_names_by_its_file_name_exists(doc: Path) -> None:
    # `lifecycle.py` alone, as prose names a module: some file of the repository has that name.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    names = {path.rsplit("/", 1)[-1] for path in tracked.splitlines()}
    bare = {name for name in backticked(doc.read_text()) if looks_like_path(name) and "/" not in name}
    missing = sorted(name for name in bare if name.endswith(".py") and name not in names)
    assert not missing, f"{_id(doc)} names modules no file of the repository is: {missing}"


def test_the_readme_configuration_table_names_every_setting() -> None:
    section = (REPO / "README.md").read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])}
    variables = {field.alias for field in Settings.model_fields.values()}
    missing = sorted(variables - documented)
    assert not missing, f"settings README's Configuration table does not name: {missing}"
