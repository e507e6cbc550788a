"""No module over 500 lines outside tests/ (the service, the client, the local stack, the functions
and the benches), no test module over 600: a module a newcomer opens holds one responsibility they
can read in one sitting. A module that grows past its bound is split by responsibility, not
squeezed."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE_LINES = 500
TEST_LINES = 600


def tracked_python_modules() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [path for path in listed.stdout.splitlines() if (REPO / path).is_file()]


def lines_of(path: str) -> int:
    return len((REPO / path).read_text().splitlines())


def test_no_module_outside_the_tests_is_over_500_lines():
    modules = [path for path in tracked_python_modules() if not path.startswith("tests/")]
    assert len(modules) > 100
    over = {path: lines_of(path) for path in modules if lines_of(path) > CODE_LINES}
    assert over == {}, f"modules over {CODE_LINES} lines: split them by responsibility"


def test_no_test_module_is_over_600_lines():
    modules = [path for path in tracked_python_modules() if path.startswith("tests/")]
    assert len(modules) > 50
    over = {path: lines_of(path) for path in modules if lines_of(path) > TEST_LINES}
    assert over == {}, f"test modules over {TEST_LINES} lines: split them by subject"
