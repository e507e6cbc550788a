"""The repository paths a doc names in backticks, and where each is found.

The docs name a file from the repository root (`tests/deploy/test_template.py`), from a package's
folder (`freeinference_batch_local/aws_faults/config.py`), or, for the service, from inside its
package (`worker/settling.py`, as docs/ARCHITECTURE.md's module table does). A name with a
placeholder or a wildcard (`functions/<name>/app.py`, `events/api-*.json`) names no one file and
is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "layers/batch_core/freeinference_batch"
# Where a doc's path may start: the repository, the folder holding each package, the service package.
ROOTS = (REPO, REPO / "layers/batch_core", REPO / "clients", REPO / "local_stack", SERVICE)
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".toml", ".js", ".css", ".html", ".txt", ".in")
# Characters no path of the repository holds: placeholders, wildcards, ellipses, keys (`MODEL#<id>/LOAD`).
NOT_A_PATH = re.compile(r"[\s<>{}*#…$=:,()\[\]\"']|\.\.\.")


def without_code_blocks(text: str) -> str:
    """The text less its fenced blocks (commands and samples, not references)."""
    return re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)


def backticked(text: str) -> list[str]:
    """Every inline code span of the text, in order (code blocks left out)."""
    return re.findall(r"`([^`]+)`", without_code_blocks(text))


def looks_like_path(name: str) -> bool:
    """A name written as a path: with a `/` or a file's suffix, and nothing no path holds."""
    if NOT_A_PATH.search(name) or name.startswith(("/", ".", "-")) or "//" in name:
        return False
    return "/" in name or name.endswith(FILE_SUFFIXES)


def found_at(name: str) -> list[Path]:
    """Each root under which `name` exists (a file, or a folder when it ends with `/`)."""
    found = []
    for root in ROOTS:
        path = root / name.rstrip("/")
        if path.is_dir() if name.endswith("/") else path.exists():
            found.append(path)
    return found
