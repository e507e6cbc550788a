"""template.yaml's functions and HTTP API: every handler exists, the API has its routes and the
console its own, the API is throttled and logs every request, and every function logs to a
group of its own with the stack's retention."""

from __future__ import annotations

import ast
import json
from typing import Any

from tests.deploy.templates import API_METHOD_REFUSALS, API_ROUTES, CONSOLE_ROUTES, REPO, events_of_type


def test_every_handler_file_exists(functions: dict[str, dict[str, Any]]) -> None:
    for logical_id, properties in functions.items():
        module, _, handler = properties["Handler"].partition(".")
        source = REPO / properties["CodeUri"] / f"{module}.py"
        assert source.is_file(), f"{logical_id}: {source.relative_to(REPO)} does not exist"
        tree = ast.parse(source.read_text())
        defined = {
            node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        } | {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        assert handler in defined, f"{logical_id}: {source.relative_to(REPO)} defines no {handler}"


def _routes(properties: dict[str, Any]) -> set[tuple[str, str]]:
    return {(event["Method"].upper(), event["Path"]) for event in events_of_type(properties, "HttpApi")
            if event.get("ApiId") == {"Ref": "BatchApi"}}


def test_api_has_its_routes(functions: dict[str, dict[str, Any]]) -> None:
    assert _routes(functions["ApiFunction"]) == API_ROUTES | API_METHOD_REFUSALS
    # The only other routes are the console's: the API stays under /v1, the console outside it.
    others = {logical_id: _routes(properties) for logical_id, properties in functions.items()
              if logical_id != "ApiFunction" and _routes(properties)}
    assert others == {"ConsoleFunction": CONSOLE_ROUTES}
    assert not any(path.startswith("/v1") for _, path in CONSOLE_ROUTES)


def test_the_console_ships_with_its_function_and_the_bucket_lets_it_read_body_urls(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    console = functions["ConsoleFunction"]
    static = REPO / console["CodeUri"] / "static"
    assert {"index.html", "console.js", "console.css"} <= {path.name for path in static.iterdir()}
    assert "Policies" not in console, "the console makes no AWS call: its role needs nothing"
    (rule,) = template["Resources"]["PayloadBucket"]["Properties"]["CorsConfiguration"]["CorsRules"]
    assert rule["AllowedMethods"] == ["GET"]
    assert rule["AllowedOrigins"] == [{"Fn::Sub": "https://*.execute-api.${AWS::Region}.${AWS::URLSuffix}"}]
    console_url = template["Outputs"]["ConsoleUrl"]["Value"]["Fn::Sub"]
    assert console_url.startswith("https://${BatchApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}")


def test_the_http_api_is_throttled_and_logs_every_request(template: dict[str, Any]) -> None:
    api = template["Resources"]["BatchApi"]["Properties"]
    throttling = api["DefaultRouteSettings"]
    assert throttling["ThrottlingBurstLimit"] == {"Ref": "ApiThrottlingBurstLimit"}
    assert throttling["ThrottlingRateLimit"] == {"Ref": "ApiThrottlingRateLimit"}
    for name in ("ApiThrottlingBurstLimit", "ApiThrottlingRateLimit"):
        assert template["Parameters"][name]["Default"] > 0
    logs = api["AccessLogSettings"]
    group = template["Resources"][logs["DestinationArn"]["Fn::GetAtt"][0]]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    line = json.loads(logs["Format"])  # one JSON object per request
    assert {"requestId", "routeKey", "status"} <= set(line)
    # Users' keys travel in headers: an access log never holds one.
    assert "header" not in logs["Format"].lower() and "authorization" not in logs["Format"].lower()


def test_every_function_logs_to_its_own_group_with_retention(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    assert template["Parameters"]["LogRetentionDays"]["Default"] == 30
    groups = set()
    for logical_id, properties in functions.items():
        group = properties["LoggingConfig"]["LogGroup"]["Ref"]
        assert template["Resources"][group]["Type"] == "AWS::Logs::LogGroup", logical_id
        assert template["Resources"][group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        groups.add(group)
    assert len(groups) == len(functions)
