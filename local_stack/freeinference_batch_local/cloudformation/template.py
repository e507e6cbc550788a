"""Reading `template.yaml`, the one source of truth for infrastructure.

CloudFormation's short-form tags (`!Ref`, `!GetAtt`, `!Sub`, ...) are not plain YAML, so
`load_template` turns each into its long form (`{"Ref": x}`, `{"Fn::GetAtt": [res, attr]}`,
`{"Fn::Sub": ...}`), which is what CloudFormation itself sees. The local stack and the tests
read the template through this module; it runs only outside Lambda (PyYAML is a dev dependency).
"""

from __future__ import annotations

import copy
import os
import re
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


def load_template(path: str | Path, *, nested: bool = True) -> dict[str, Any]:
    """The template at `path` as plain data, short-form tags expanded to their long form; with
    `nested`, every nested application whose Location is a local file is expanded in place
    (`expand_applications`), so callers see one namespace of resources as the deployed whole."""
    with open(path, encoding="utf-8") as handle:
        # (bandit's B506: _CfnLoader is a SafeLoader subclass, which makes no arbitrary objects.)
        template = yaml.load(handle, Loader=_CfnLoader)  # nosec B506
    if not isinstance(template, dict):
        raise ValueError(f"{path}: not a CloudFormation template (top level is not a mapping)")
    return expand_applications(template, Path(path).parent) if nested else template


# ---------------------------------------------------------------- nested applications
#
# `AWS::Serverless::Application` with a local `Location` is a nested stack of another template
# file, its Parameters given by the parent. Expanded here, each resource `R` of the child becomes
# `<Application>/R` of the parent (the "full path" `sam local` and `sam build` use), with every
# reference to a child parameter replaced by the parent's value for it (an expression in the
# parent's terms), references to child resources renamed, local paths (CodeUri, ContentUri)
# made relative to the parent's folder, and the child's Globals applied to its functions (a
# nested stack has its own Globals; the parent's do not reach it). The Application resource
# itself stays, marking the block; `NESTED_KEY` on each expanded resource names its application.
# The parent's `!GetAtt <Application>.Outputs.<Name>` (and `${<Application>.Outputs.<Name>}` in a
# Sub) reads as the child output's value, in the parent's terms too.

NESTED_KEY = "NestedIn"
_LOCAL_PATHS = ("CodeUri", "ContentUri")
_SUB_NAME = re.compile(r"\$\{([^}!][^}]*)\}")
# What a child template's AWS::StackName / AWS::StackId mean on AWS is the nested stack's own
# name, not the parent's: pass the parent's as a parameter instead.
_NESTED_ONLY_PSEUDO = ("AWS::StackName", "AWS::StackId")


def expand_applications(template: dict[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """`template` with its local nested applications expanded (see above); a copy."""
    out = copy.deepcopy(template)
    resources: dict[str, Any] = {}
    outputs: dict[str, dict[str, Any]] = {}
    for logical_id, resource in (template.get("Resources") or {}).items():
        resources[logical_id] = copy.deepcopy(resource)
        if resource.get("Type") != "AWS::Serverless::Application":
            continue
        location = (resource.get("Properties") or {}).get("Location")
        if not isinstance(location, str) or "://" in location:
            continue  # a SAR application or a template in S3: nothing local to expand
        child_path = Path(base_dir) / location
        child = load_template(child_path, nested=True)
        given = (resource.get("Properties") or {}).get("Parameters") or {}
        nested, outputs[logical_id] = _nested_resources(logical_id, child, given, child_path.parent, Path(base_dir))
        for name, resolved in nested.items():
            if name in resources or name in template.get("Resources", {}):
                raise ValueError(f"{name} is defined twice")
            resources[name] = resolved
    out["Resources"] = _resolve_outputs(resources, outputs)
    if "Outputs" in out:
        out["Outputs"] = _resolve_outputs(out["Outputs"], outputs)
    return out


def _resolve_outputs(value: Any, outputs: dict[str, dict[str, Any]]) -> Any:
    """`value` with each reference to an expanded application's output replaced by its value."""
    if isinstance(value, list):
        return [_resolve_outputs(item, outputs) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, argument),) = value.items()
        if key == "Fn::GetAtt":
            resource, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
            if resource in outputs and attribute.startswith("Outputs."):
                return copy.deepcopy(_output(outputs, resource, attribute))
        if key == "Fn::Sub":
            text, variables = (argument, {}) if isinstance(argument, str) else argument
            variables = {name: _resolve_outputs(item, outputs) for name, item in variables.items()}

            def replace(match: re.Match[str]) -> str:
                resource, _, attribute = match.group(1).partition(".")
                if match.group(1) in variables or resource not in outputs or not attribute.startswith("Outputs."):
                    return match.group(0)
                inline = _sub_text(_output(outputs, resource, attribute))
                if inline is None:
                    raise ValueError(f"${{{match.group(1)}}}: an output read in a Sub must be a literal, a Ref or "
                                     "a GetAtt; use !GetAtt as a Sub variable instead")
                return inline

            text = _SUB_NAME.sub(replace, text)
            return {"Fn::Sub": [text, variables] if variables else text}
    return {key: _resolve_outputs(item, outputs) for key, item in value.items()}


def _output(outputs: dict[str, dict[str, Any]], application: str, attribute: str) -> Any:
    name = attribute.removeprefix("Outputs.")
    if name not in outputs[application]:
        raise ValueError(f"{application} has no output {name}")
    return outputs[application][name]


def _sub_text(value: Any) -> str | None:
    """How a parameter's value reads inside an Fn::Sub string of the parent, or None if it has
    to stay a variable: a literal as itself, a Ref as ${X}, a GetAtt as ${R.A}."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, dict) and set(value) == {"Ref"} and isinstance(value["Ref"], str):
        return "${" + value["Ref"] + "}"
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        argument = value["Fn::GetAtt"]
        return "${" + (argument if isinstance(argument, str) else ".".join(argument)) + "}"
    return None


def _nested_resources(application: str, child: dict[str, Any], given: dict[str, Any], child_dir: Path,
                      base_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The child's resources, named and written in the parent's terms, and its outputs' values."""
    if child.get("Conditions"):
        raise ValueError(f"{application}: conditions in a nested template are not expanded; keep it literal")
    parameters = child.get("Parameters") or {}
    unknown = set(given) - set(parameters)
    if unknown:
        raise ValueError(f"{application} passes parameters its template does not declare: {sorted(unknown)}")
    values = {}
    for name, declaration in parameters.items():
        if name in given:
            values[name] = given[name]
        elif "Default" in declaration:
            values[name] = declaration["Default"]
        else:
            raise ValueError(f"{application} gives no value for {name}, which has no Default")
    child_resources = set(child.get("Resources") or {})

    def rename(name: str) -> str:
        return f"{application}/{name}"

    def rewrite(value: Any) -> Any:
        if isinstance(value, list):
            return [rewrite(item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref" and isinstance(argument, str):
                if argument in values:
                    return copy.deepcopy(values[argument])
                if argument in _NESTED_ONLY_PSEUDO:
                    raise ValueError(f"{application}: the nested template uses {argument}; pass the parent's instead")
                return {"Ref": rename(argument)} if argument in child_resources else value
            if key == "Fn::GetAtt":
                resource, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
                return {"Fn::GetAtt": [rename(resource) if resource in child_resources else resource, attribute]}
            if key == "Fn::Sub":
                return _rewrite_sub(argument)
        return {key: rewrite(item) for key, item in value.items()}

    def _rewrite_sub(argument: Any) -> Any:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        variables = {name: rewrite(item) for name, item in variables.items()}
        passed: dict[str, Any] = {}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return match.group(0)
            if name in _NESTED_ONLY_PSEUDO:
                raise ValueError(f"{application}: the nested template uses ${{{name}}}; pass the parent's instead")
            if name in values:
                inline = _sub_text(values[name])
                if inline is not None:
                    return inline
                passed[name] = copy.deepcopy(values[name])
                return match.group(0)
            resource = name.split(".", 1)[0]
            return "${" + rename(name) + "}" if resource in child_resources else match.group(0)

        text = _SUB_NAME.sub(replace, text)
        variables = {**variables, **passed}
        if variables:
            return {"Fn::Sub": [text, variables]}
        return {"Fn::Sub": text} if "${" in text else text  # nothing left to substitute: plain text

    function_globals = rewrite(((child.get("Globals") or {}).get("Function")) or {})
    out = {}
    for name, resource in (child.get("Resources") or {}).items():
        resolved = rewrite(resource)
        if "DependsOn" in resolved:
            depends = resolved["DependsOn"]
            resolved["DependsOn"] = [rename(d) for d in depends] if isinstance(depends, list) else rename(depends)
        properties = resolved.get("Properties") or {}
        if resolved.get("Type") == "AWS::Serverless::Function":
            properties = _merge_globals(function_globals, properties)
        for key in _LOCAL_PATHS:
            if isinstance(properties.get(key), str) and "://" not in properties[key]:
                local = os.path.relpath(child_dir / properties[key], base_dir)
                # A child outside the parent's folder (a template written elsewhere naming the
                # repo's model/template.yaml by its absolute path, as bench/_common.py does) keeps
                # an absolute path: the functions' code is found relative to the repo root, which
                # a path climbing out of another folder would not reach.
                if local.startswith(os.pardir):
                    local = os.path.normpath(child_dir / properties[key])
                properties[key] = local + "/"
        if properties:
            resolved["Properties"] = properties
        resolved[NESTED_KEY] = application
        out[rename(name)] = resolved
    return out, {name: rewrite(output["Value"]) for name, output in (child.get("Outputs") or {}).items()}


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
    if NESTED_KEY in resource:  # its own template's Globals are applied already; the parent's do not reach it
        return copy.deepcopy(resource.get("Properties") or {})
    global_properties = template.get("Globals", {}).get("Function", {})
    return _merge_globals(global_properties, resource.get("Properties", {}))
