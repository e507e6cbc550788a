"""Time as the service sees it.

Production reads the wall clock. The local stack and the tests can point
`BATCH_CLOCK_OFFSET_FILE` at a file holding a number of seconds to add, so time-dependent
behaviour (the 00:00 UTC quota renewal, the completion window, retention) is tested by moving
the clock instead of waiting. The file is re-read when it changes, so another process (a test)
can move the clock of a running stack.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time

_lock = threading.Lock()
_cache: dict[str, tuple[float, float]] = {}  # path -> (mtime, offset)


def _offset(path: str) -> float:
    if not path:
        return 0.0
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return 0.0
    with _lock:
        cached = _cache.get(path)
        if cached and cached[0] == mtime:
            return cached[1]
        try:
            with open(path) as handle:
                offset = float(handle.read().strip() or 0)
        except (OSError, ValueError):
            offset = 0.0
        _cache[path] = (mtime, offset)
        return offset


def now(offset_file: str = "") -> float:
    """Unix time in seconds (float)."""
    return time.time() + _offset(offset_file)


def utc_day(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d")


def next_utc_midnight(timestamp: float) -> float:
    day = dt.datetime.fromtimestamp(timestamp, dt.UTC).date() + dt.timedelta(days=1)
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def set_offset(path: str, seconds: float) -> None:
    """Used by the local stack's tests: move the clock of every process reading `path`."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(repr(float(seconds)))
    os.replace(tmp, path)
    # A write within the same mtime tick must still be seen.
    with _lock:
        _cache.pop(path, None)
