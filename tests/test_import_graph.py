"""No import circle in any of the project's packages (the service, the client side, the local
stack): every arrow points one way, so a module can be read, tested and moved with what it
imports and nothing that imports it. Imports inside functions count too (one such import once hid
a circle between two of the local stack's modules). And no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "freeinference_batch": REPO / "layers/batch_core/freeinference_batch",
    "freeinference_batch_client": REPO / "clients/freeinference_batch_client",
    "freeinference_batch_local": REPO / "local_stack/freeinference_batch_local",
}


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `path` (module `name`) imports, anywhere in it: `from a.b import c`
    counts as `a.b.c` when that is a module, else as `a.b`."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = {
        module_name(package, root, path): path
        for package, root in PACKAGES.items()
        for path in root.rglob("*.py")
    }
    return {name: imported_modules(name, path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_has_an_import_circle(package: str):
    graph = {name: edges for name, edges in import_graph().items() if name.split(".")[0] == package}
    graph = {name: edges & graph.keys() for name, edges in graph.items()}
    assert len(graph) > 5, f"{package}: no modules found"
    assert circles(graph) == [], f"{package}: modules that import each other, directly or round a loop"


def test_the_service_package_imports_neither_of_the_other_two():
    graph = import_graph()
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("freeinference_batch.")
        for target in targets
        if not target.startswith("freeinference_batch.") and target != "freeinference_batch"
    )
    assert upward == []


def test_no_test_module_imports_another():
    # What tests share lives in helper modules (helpers.py, conftest.py, ...): a test module can
    # then be split, renamed or deleted without breaking another one.
    imports = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            imports += [f"{path.relative_to(REPO)} -> {name}" for name in names
                        if name.rpartition(".")[2].startswith("test_")]
    assert imports == []
