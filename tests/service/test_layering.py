"""The service package's layers, read from its source with `ast`: `store/` is the only code that
speaks to AWS's data services (DynamoDB expressions, clients of DynamoDB, SQS, S3, EventBridge,
CloudWatch), `core/` and `store/` depend on nothing above them, and the package's top level stays
a handful of entry points."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layers/batch_core/freeinference_batch"
NAME = "freeinference_batch"

# The data-access package, and the module that makes the boto3 clients it uses.
DATA_ACCESS = "store"
CLIENT_FACTORY = "core/aws.py"
# What core/aws.py offers besides clients: Secrets Manager through Powertools Parameters, how an
# AWS error reads, and the deadline an invocation's calls stop retrying by.
AWS_HELPERS_ANYONE_MAY_CALL = {"secret_string", "is_passing_failure", "reset_clients", "deadline"}
EXPRESSION_PARAMETERS = {"UpdateExpression", "ConditionExpression", "KeyConditionExpression", "FilterExpression",
                         "ProjectionExpression", "ExpressionAttributeNames", "ExpressionAttributeValues"}
# The text of a DynamoDB expression: an update clause, a function of one, or a comparison with a
# `:value` or of a `#name`.
EXPRESSION_TEXT = re.compile(r"(^|\s)(SET|ADD|REMOVE)\s+[\w#]|attribute_(not_)?exists\(|begins_with\(|if_not_exists\("
                             r"|[#\w.]+\s*(=|<>|<=|>=|<|>)\s*:\w|\bIN\s*\(:|#\w+\s*=")
ABOVE_CORE_AND_STORE = ("batches", "worker", "webhooks", "ops", "accounts", "api")
MOST_TOP_LEVEL_MODULES = 12


def modules() -> dict[str, ast.Module]:
    """Every module of the package by its path in it (`store/leases.py`)."""
    return {str(path.relative_to(PACKAGE)): ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


def outside_data_access() -> dict[str, ast.Module]:
    return {path: tree for path, tree in modules().items() if not path.startswith(f"{DATA_ACCESS}/")}


def docstrings(tree: ast.Module) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def imported(tree: ast.Module) -> set[str]:
    """The package's modules a module imports (at its top or inside a function), dotted."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == NAME or name.startswith(f"{NAME}.")}


def test_no_dynamodb_expression_outside_the_data_access_package():
    found = []
    for path, tree in outside_data_access().items():
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in EXPRESSION_PARAMETERS:
                found.append(f"{path}:{node.value.lineno}: {node.arg}=")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip and (
                    node.value in EXPRESSION_PARAMETERS or EXPRESSION_TEXT.search(node.value)):
                found.append(f"{path}:{node.lineno}: {node.value!r}")
    assert not found, f"DynamoDB expressions belong in {DATA_ACCESS}/ (a named write there): {found}"


def test_no_aws_client_outside_the_data_access_package():
    found = []
    for path, tree in outside_data_access().items():
        if path == CLIENT_FACTORY:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)):
                continue
            owner, called = node.func.value.id, node.func.attr
            if owner == "aws" and called not in AWS_HELPERS_ANYONE_MAY_CALL:
                found.append(f"{path}:{node.lineno}: aws.{called}()")
        # A client or resource of boto3's own making (boto3.client, boto3.session.Session(), ...).
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found.extend(f"{path}:{node.lineno}: import {n}" for n in names if n.split(".")[0] == "boto3")
    assert not found, f"AWS calls belong in named functions of {DATA_ACCESS}/: {found}"


def test_core_and_store_import_nothing_above_them():
    above = tuple(f"{NAME}.{name}" for name in ABOVE_CORE_AND_STORE)
    found = {}
    for path, tree in modules().items():
        if path.startswith(("core/", f"{DATA_ACCESS}/")):
            names = sorted(n for n in imported(tree) if n in above or n.startswith(tuple(f"{a}." for a in above)))
            if names:
                found[path] = names
    assert not found, f"core/ and {DATA_ACCESS}/ serve the rest and import none of it: {found}"


def test_the_package_top_level_is_a_handful_of_modules():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MOST_TOP_LEVEL_MODULES, top


def test_the_checks_see_what_they_look_for():
    # The rules above pass on what they cannot see: each finds its target where it must be.
    store = {path: tree for path, tree in modules().items() if path.startswith(f"{DATA_ACCESS}/")}
    keywords = {node.arg for tree in store.values() for node in ast.walk(tree) if isinstance(node, ast.keyword)}
    assert {"UpdateExpression", "ConditionExpression", "KeyConditionExpression"} <= keywords
    texts = [node.value for tree in store.values() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert any(EXPRESSION_TEXT.search(text) for text in texts)
    assert not any(EXPRESSION_TEXT.search(text) for text in ("Batch not found", "a = b", "cost_nano", "SETTINGS"))
    assert f"{NAME}.worker.model_backoff" in imported(ast.parse("from freeinference_batch.worker import model_backoff"))
