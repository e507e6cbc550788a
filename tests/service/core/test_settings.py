"""A setting's default lives in two places: `Settings` (what the local stack, the tests and any
run without the variable use) and the template parameter a deployed stack passes as the variable
(what a deployed stack uses, as the README says). They must agree, or a deployed stack and the
local stack would run with different limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from freeinference_batch.core.settings import Settings
from freeinference_batch_local.cloudformation.template import load_template

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = [REPO / "template.yaml", REPO / "model/template.yaml"]


def passed_parameters(path: Path) -> dict[str, str]:
    """Setting variable -> the template parameter it is given (`BATCH_MAX_ATTEMPTS: !Ref MaxAttempts`)."""
    template = load_template(path)
    blocks = [((template.get("Globals") or {}).get("Function") or {}).get("Environment", {}).get("Variables") or {}]
    blocks += [(resource.get("Properties") or {}).get("Environment", {}).get("Variables") or {}
               for resource in template["Resources"].values()]
    parameters = template.get("Parameters") or {}
    return {name: value["Ref"] for block in blocks for name, value in block.items()
            if isinstance(value, dict) and value.get("Ref") in parameters}


def settings_default(variable: str) -> object:
    field = next((f for f in Settings.model_fields.values() if f.alias == variable), None)
    if field is None:
        return None  # not a setting (POWERTOOLS_LOG_LEVEL...)
    return field.default


def test_the_root_template_passes_the_settings_it_parameterizes():
    assert set(passed_parameters(REPO / "template.yaml")) >= {
        "BATCH_MAX_REQUESTS", "BATCH_COMPLETION_WINDOW_SECONDS", "BATCH_RETENTION_SECONDS", "BATCH_MAX_ATTEMPTS",
        "BATCH_UPSTREAM_TIMEOUT_SECONDS", "WEBHOOK_RETRY_WINDOW_SECONDS", "WEBHOOK_RETRY_BASE_SECONDS",
        "WEBHOOK_RETRY_MAX_SECONDS"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_template_parameters_default_is_the_settings_default(path):
    root = load_template(REPO / "template.yaml")["Parameters"]
    parameters = load_template(path)["Parameters"]
    checked = 0
    for variable, parameter in passed_parameters(path).items():
        if not isinstance(settings_default(variable), int | float):
            continue  # names and URLs of the stack's resources (BATCH_TABLE_NAME...), not defaults
        # A nested template's parameter has no default of its own: the root passes its parameter's.
        default = parameters[parameter].get("Default", root.get(parameter, {}).get("Default"))
        assert default is not None, f"{path.relative_to(REPO)}: parameter {parameter} has no default"
        assert float(default) == float(settings_default(variable)), (
            f"{path.relative_to(REPO)}: parameter {parameter} defaults to {default}, settings.py's {variable} to "
            f"{settings_default(variable)}: make them equal")
        checked += 1
    assert checked >= 8
