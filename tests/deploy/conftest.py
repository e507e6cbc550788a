"""The deploy tests' fixtures: the root template expanded (nested applications in place), and
its functions' properties."""

from __future__ import annotations

from typing import Any

import pytest
from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type

from tests.deploy.templates import TEMPLATE


@pytest.fixture(scope="session")
def template() -> dict[str, Any]:
    return load_template(TEMPLATE)


@pytest.fixture(scope="session")
def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Logical id -> properties with Globals applied, for every AWS::Serverless::Function."""
    return {
        logical_id: function_properties(template, logical_id)
        for logical_id in resources_of_type(template, "AWS::Serverless::Function")
    }
