"""The templates lint clean (cfn-lint), `sam build` builds them as Lambda runs them (arm64,
CPython 3.13, the service alone in the layer), and they use nothing the local stack cannot read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.templates import MODEL_TEMPLATE, MONITORING_TEMPLATE, REPO, TEMPLATE

SAM = REPO / ".tools" / "sam" / "bin" / "sam"
# Same as the Makefile's: lets the pyenv shim resolve python3.13, which `sam build` needs.
SAM_PYENV_VERSION = "3.11.7:3.13.0"


def test_cfn_lint_reports_nothing() -> None:
    cfn_lint = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert cfn_lint, "cfn-lint is not installed (it is in the dev extras: make install)"
    result = subprocess.run([cfn_lint, "--", str(TEMPLATE), str(MODEL_TEMPLATE), str(MONITORING_TEMPLATE)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def _sam_env() -> dict[str, str]:
    env = {**os.environ, "PYENV_VERSION": SAM_PYENV_VERSION, "SAM_CLI_TELEMETRY": "0"}
    # Put a real python3.13 first on PATH too, in case the pyenv shims are not on it.
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for bin_dir in sorted(pyenv_root.glob("versions/3.13*/bin"), reverse=True):
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        break
    return env


@pytest.mark.slow
def test_sam_build_succeeds(tmp_path: Path, functions: dict[str, dict[str, Any]]) -> None:
    if not SAM.exists():
        message = f"{SAM.relative_to(REPO)} is missing: `make install` installs aws-sam-cli in its own venv"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # sam writes build.toml next to the build dir, so give it a folder of its own.
    build_dir = tmp_path / "build"
    started = time.monotonic()
    result = subprocess.run(
        [str(SAM), "build", "--template-file", str(TEMPLATE), "--build-dir", str(build_dir)],
        cwd=REPO,
        env=_sam_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(f"sam build took {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr

    for logical_id, properties in functions.items():
        module = properties["Handler"].partition(".")[0]
        assert (build_dir / logical_id / f"{module}.py").is_file(), f"{logical_id}: {module}.py not built"
    package = build_dir / "BatchCoreLayer" / "python" / "freeinference_batch"
    assert (package / "__init__.py").is_file()
    assert (package / "core" / "settings.py").is_file()
    assert (package / "core" / "models.json").is_file()
    # The service only: the client side and the local stack are other packages, never shipped.
    for moved in ("local", "cli", "client.py", "openai_files.py"):
        assert not (package / moved).exists(), f"the built layer has freeinference_batch/{moved}"
    # Binary wheels must be the Lambda runtime's (CPython 3.13 on arm64), not this machine's.
    layer = build_dir / "BatchCoreLayer" / "python"
    assert list(layer.glob("pydantic_core/*cpython-313-aarch64-linux-gnu.so")), "no arm64 cp313 pydantic_core"
    development_side = {"freeinference_batch_client", "freeinference_batch_local", "click", "tqdm", "moto"}
    assert not {p.name for p in layer.iterdir()} & development_side


def test_no_fn_foreach() -> None:
    # The local stack and moto read the template as written; Fn::ForEach needs the
    # AWS::LanguageExtensions transform, which neither expands.
    for path in (TEMPLATE, MODEL_TEMPLATE, MONITORING_TEMPLATE):
        assert "ForEach" not in path.read_text(), path.relative_to(REPO)
