"""The local stack's state file, `.local-stack/state.json` in the directory it was started from.

A running stack writes it so that other processes on the machine (the admin CLI, tests) can
reach the same moto server, tables and queues: it holds the environment the stack applied
(`AWS_ENDPOINT_URL`, table names, queue URLs, `BATCH_*` settings), the API base URL and the
stack's pid. The stack removes it when it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

STATE_DIR = ".local-stack"
STATE_FILE = "state.json"


def state_path(directory: str | Path | None = None) -> Path:
    return Path(directory or os.getcwd()) / STATE_DIR / STATE_FILE


def write_state(env: dict[str, str], base_url: str, directory: str | Path | None = None, **extra: Any) -> Path:
    """Write the state file atomically (a reader never sees half a file) and return its path."""
    path = state_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"env": dict(env), "base_url": base_url, "pid": os.getpid(), **extra}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_state(directory: str | Path | None = None) -> dict[str, Any] | None:
    """The state of the stack started from `directory` (default: cwd), or None if none is running.

    A file left behind by a stack that died without cleaning up (its pid is gone) reads as None.
    """
    path = state_path(directory)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not _alive(state.get("pid")):
        return None
    return state


def remove_state(directory: str | Path | None = None) -> None:
    path = state_path(directory)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only if empty


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
