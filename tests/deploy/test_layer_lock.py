"""The layer's lock file: every runtime package pinned, in agreement with what it was made from."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LAYER = Path(__file__).resolve().parents[2] / "layers" / "batch_core"
PYPROJECT = LAYER.parents[1] / "pyproject.toml"


def requirements(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def pins() -> dict[str, Version]:
    pinned = {}
    for requirement in requirements(LAYER / "requirements.txt"):
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{requirement} is not pinned"
        pinned[canonicalize_name(requirement.name)] = Version(spec.version)
    return pinned


def test_every_package_of_the_layer_is_pinned_once():
    names = [canonicalize_name(r.name) for r in requirements(LAYER / "requirements.txt")]
    assert len(names) == len(set(names)) and len(pins()) == len(names)


def test_the_pins_meet_the_layers_direct_dependencies_and_the_projects_runtime_ones():
    pinned = pins()
    runtime = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    direct = requirements(LAYER / "requirements.in")
    for requirement in [*direct, *(Requirement(r) for r in runtime if not r.startswith(("click", "tqdm")))]:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in the lock file"
        version = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} vs {requirement}"
