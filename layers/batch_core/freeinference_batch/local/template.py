"""Reading `template.yaml`, the one source of truth for infrastructure.

CloudFormation's short-form tags (`!Ref`, `!GetAtt`, `!Sub`, ...) are not plain YAML, so
`load_template` turns each into its long form (`{"Ref": x}`, `{"Fn::GetAtt": [res, attr]}`,
`{"Fn::Sub": ...}`), which is what CloudFormation itself sees. The local stack and the tests
read the template through this module; it runs only outside Lambda (PyYAML is a dev dependency).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

# Short-form tags whose long form is `Fn::<Name>`; `!Ref` and `!Condition` are special-cased.
_FN_TAGS = (
    "And",
    "Base64",
    "Cidr",
    "Equals",
    "FindInMap",
    "GetAtt",
    "GetAZs",
    "If",
    "ImportValue",
    "Join",
    "Length",
    "Not",
    "Or",
    "Select",
    "Split",
    "Sub",
    "ToJsonString",
    "Transform",
)


class _CfnLoader(yaml.SafeLoader):
    """SafeLoader that understands CloudFormation tags and keeps dates as strings."""


def _construct_node(loader: _CfnLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


def _ref(loader: _CfnLoader, node: yaml.Node) -> dict[str, Any]:
    return {"Ref": _construct_node(loader, node)}


def _condition(loader: _CfnLoader, node: yaml.Node) -> dict[str, Any]:
    return {"Condition": _construct_node(loader, node)}


def _get_att(loader: _CfnLoader, node: yaml.Node) -> dict[str, Any]:
    value = _construct_node(loader, node)
    if isinstance(value, str):
        # `!GetAtt Res.Attr` splits at the first dot only (attributes such as `Endpoint.Address` have dots).
        resource, _, attribute = value.partition(".")
        value = [resource, attribute]
    return {"Fn::GetAtt": value}


def _fn(name: str):
    def construct(loader: _CfnLoader, node: yaml.Node) -> dict[str, Any]:
        return {f"Fn::{name}": _construct_node(loader, node)}

    return construct


_CfnLoader.add_constructor("!Ref", _ref)
_CfnLoader.add_constructor("!Condition", _condition)
for _name in _FN_TAGS:
    _CfnLoader.add_constructor(f"!{_name}", _get_att if _name == "GetAtt" else _fn(_name))
# CloudFormation reads `AWSTemplateFormatVersion: 2010-09-09` (unquoted) as a string, not a date.
_CfnLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def load_template(path: str | Path) -> dict[str, Any]:
    """The template at `path` as plain data, short-form tags expanded to their long form."""
    with open(path, encoding="utf-8") as handle:
        template = yaml.load(handle, Loader=_CfnLoader)  # a SafeLoader subclass: no arbitrary objects
    if not isinstance(template, dict):
        raise ValueError(f"{path}: not a CloudFormation template (top level is not a mapping)")
    return template


def resources_of_type(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resource, for every resource of `resource_type` (e.g. `AWS::SQS::Queue`)."""
    return {
        logical_id: resource
        for logical_id, resource in template.get("Resources", {}).items()
        if resource.get("Type") == resource_type
    }


def _merge_globals(global_value: Any, local_value: Any) -> Any:
    # SAM's rules: maps merge (the resource wins on a clash), lists concatenate (globals first),
    # anything else is replaced by the resource's value.
    if isinstance(global_value, dict) and isinstance(local_value, dict):
        merged = copy.deepcopy(global_value)
        for key, value in local_value.items():
            merged[key] = _merge_globals(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    if isinstance(global_value, list) and isinstance(local_value, list):
        return copy.deepcopy(global_value) + copy.deepcopy(local_value)
    return copy.deepcopy(local_value)


def function_properties(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    """An `AWS::Serverless::Function`'s properties with `Globals.Function` applied as SAM does."""
    resource = template["Resources"][logical_id]
    if resource.get("Type") != "AWS::Serverless::Function":
        raise ValueError(f"{logical_id} is a {resource.get('Type')}, not an AWS::Serverless::Function")
    global_properties = template.get("Globals", {}).get("Function", {})
    return _merge_globals(global_properties, resource.get("Properties", {}))
