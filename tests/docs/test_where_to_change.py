"""docs/ARCHITECTURE.md opens with "Where to change…": for each common change, every file that
must change with it and the tests that hold them together. A newcomer follows it to the letter,
so every file it names must exist where it says (one place only: a name two roots share would
send them to the wrong one), and every row must name a test that exists."""

from __future__ import annotations

import re

import pytest

from tests.docs.repo_paths import REPO, backticked, found_at, looks_like_path

DOC = REPO / "docs/ARCHITECTURE.md"
HEADING = "## Where to change…"
# The changes issue 29 asked the table for (words of each row's first cell).
REQUIRED_CHANGES = ("upstream timeout", "webhook retries", "AWS fault", "new model", "new API endpoint",
                    "batch status field")


def rows() -> list[list[str]]:
    """The cells of each row of the table (header and rule left out)."""
    text = DOC.read_text()
    first = re.search(r"^## .*$", text, flags=re.M)
    assert first and first.group(0) == HEADING, f"{DOC.name} does not open with {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2, f"{HEADING!r} has no table"
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


ROWS = rows()


def test_the_table_answers_the_common_changes() -> None:
    firsts = [row[0] for row in ROWS]
    for change in REQUIRED_CHANGES:
        assert any(change in first for first in firsts), f"no row for {change!r}: {firsts}"
    assert all(len(row) == 3 for row in ROWS), "each row: the change, its files, its tests"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row[0][:60])
def test_every_file_the_row_names_exists_in_one_place(row: list[str]) -> None:
    named = [name for cell in row for name in backticked(cell) if looks_like_path(name)]
    assert named, f"{row[0]!r} names no file"
    for name in named:
        found = found_at(name)
        assert found, f"{row[0]!r} names {name}, which does not exist"
        assert len(found) == 1, f"{row[0]!r}: {name} could be any of {[str(p.relative_to(REPO)) for p in found]}"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row[0][:60])
def test_every_row_names_a_test_that_exists(row: list[str]) -> None:
    tests = [name for name in backticked(row[2]) if re.fullmatch(r"tests/(\w+/)*test_\w+\.py", name)]
    assert tests, f"{row[0]!r} names no test file in its last column"
    for name in tests:
        assert (REPO / name).is_file(), f"{row[0]!r} names {name}, which does not exist"
    # A test named by itself (`test_...`) is one of those files' own.
    sources = "".join((REPO / name).read_text() for name in tests)
    for function in (name for name in backticked(row[2]) if re.fullmatch(r"test_\w+", name)):
        assert f"def {function}(" in sources, f"{row[0]!r} names {function}, which none of {tests} defines"


def test_a_name_that_is_not_a_file_fails() -> None:
    # The check has teeth: a moved module is caught, and a placeholder is not taken for a path.
    assert not found_at("batches.py") and not found_at("webhook_urls.py")
    assert found_at("batches/lifecycle.py") and found_at("freeinference_batch_local/aws_faults/config.py")
    assert not looks_like_path("functions/<name>/app.py") and not looks_like_path("MODEL#<id>/LOAD")
