"""The moto server (`server.py`) in a child process, as the local stack runs it: `python -m
freeinference_batch_local.moto.server`. The stack is one Python process, and the GIL would
otherwise put moto's work and every Lambda's on one core, so that each request's latency grows
with the total load. The child exits when its stdin closes, that is, when the stack stops or
dies. This module imports no moto: the stack's own process does not need moto's server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from freeinference_batch_local.aws_faults.config import FAULTS_ENV, SEED_ENV, FaultConfig


class MotoProcess:
    """`MotoServer` in a child process, with the same `start()` / `stop()` / `endpoint_url`."""

    START_TIMEOUT_SECONDS = 60.0

    def __init__(self, host: str = "127.0.0.1", faults: FaultConfig | None = None) -> None:
        self.host = host
        self.faults = faults
        self.endpoint_url = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> str:
        # The child imports this package and nothing of the service's: its root on the path is
        # enough, installed or not.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        # The child injects exactly these faults, with this seed (drawn here when none was given).
        env.pop(FAULTS_ENV, None)
        env.pop(SEED_ENV, None)
        if self.faults is not None and self.faults.enabled:
            env[FAULTS_ENV], env[SEED_ENV] = self.faults.describe(), str(self.faults.seed)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "freeinference_batch_local.moto.server", "--host", self.host],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            # Out of the terminal's process group: Ctrl-C is the stack's to handle, and the stack
            # stops this child itself, in its order.
            start_new_session=True,
        )
        stdout = self._process.stdout
        assert stdout is not None
        found: list[str] = []
        # The first line is the endpoint; read on a thread so a child that hangs cannot hang us.
        reader = threading.Thread(target=lambda: found.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.START_TIMEOUT_SECONDS)
        line = found[0].strip() if found else ""
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the moto server process did not start (it printed {line!r})")
        self.endpoint_url = line
        return line

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()  # the child's signal to stop
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        finally:
            if process.stdout is not None:
                process.stdout.close()
