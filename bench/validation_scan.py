"""The create body's fragmentation check on hostile input: linear in the body's size (issue 31).

`validation.check_fragmentation` strips JSON strings to count the commas and brackets outside
them, but only for a body with more than MAX_JSON_VALUES of those; here that threshold is lowered
to 0 so every input reaches the stripping. The input is the attack of issue 31: an unterminated
string of escaped quotes (`"\\"\\"\\"...`), 1, 2, 4 and 8 MB of it. Each size runs --rounds
times; the table gives the best time and its ratio to the 1 MB run (linear: 2, 4, 8).

Baseline, in this process: the backtracking regex the check used before, on the same input at
small sizes (4, 8, 16 KB: it is quadratic, so 4 times slower per doubling, and 1 MB would take
an hour), with its time extrapolated to 1 MB. Target: 8 MB within 16 times the 1 MB run (linear
is 8; quadratic would be 64), whatever else the machine runs.

    .venv/bin/python bench/validation_scan.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from freeinference_batch.batches import validation
from freeinference_batch.core.errors import BadRequest

MB = 1024 * 1024
# The check's string pattern before issue 31: from each quote of an unterminated string it scans
# to the end, fails, and starts again from the next quote.
OLD_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def hostile(size: int) -> bytes:
    """`size` bytes: `[` then an unterminated string of escaped quotes."""
    return b'["' + b'\\"' * ((size - 2) // 2)


def old_check(raw: bytes) -> None:
    stripped = OLD_JSON_STRING.sub(b'""', raw)
    stripped.count(b",") + stripped.count(b"[") + stripped.count(b"{")


def new_check(raw: bytes) -> None:
    # With the threshold at 0 every body is refused: only the time matters.
    with contextlib.suppress(BadRequest):
        validation.check_fragmentation(raw)


def best_time(check: Callable[[bytes], None], raw: bytes, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        check(raw)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per size; the best is kept")
    args = parser.parse_args()
    validation.MAX_JSON_VALUES = 0  # every input reaches the string stripping

    rows = []
    new_sizes = [1 * MB, 2 * MB, 4 * MB, 8 * MB]
    new_times = [best_time(new_check, hostile(size), args.rounds) for size in new_sizes]
    for size, seconds in zip(new_sizes, new_times, strict=True):
        rows.append(("linear scan (now)", f"{size // 1024} KB", f"{seconds * 1000:.1f} ms",
                     f"{seconds / new_times[0]:.2f}", f"{seconds / (size / MB) * 1000:.1f} ms"))
    old_sizes = [4 * 1024, 8 * 1024, 16 * 1024]
    old_times = [best_time(old_check, hostile(size), 1) for size in old_sizes]
    for size, seconds in zip(old_sizes, old_times, strict=True):
        rows.append(("backtracking regex (before)", f"{size // 1024} KB", f"{seconds * 1000:.1f} ms",
                     f"{seconds / old_times[0]:.2f} (vs 4 KB)", f"{seconds / (size / MB) * 1000:.1f} ms"))
    print(c.table(rows, ("check", "input", "time", "ratio to the first", "per MB")))

    extrapolated = old_times[-1] * (MB / old_sizes[-1]) ** 2
    print(f"\nbefore, extrapolated to 1 MB (quadratic): {extrapolated:.0f} s; now {new_times[0] * 1000:.1f} ms")
    linear = new_times[-1] <= 16 * new_times[0]
    print(f"target: 8 MB within 16x the 1 MB run: {new_times[-1] / new_times[0]:.2f}x, {c.verdict(linear)}")


if __name__ == "__main__":
    main()
