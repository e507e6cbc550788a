"""The local API Gateway's routes: the template's HttpApi events, matched as HTTP API matches them."""

from __future__ import annotations

from freeinference_batch_local.api_gateway.routes import Route, routes_from_functions, select_route
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.handlers import functions_from_template, repo_root

from tests.local_stack.api_gateway.recorder import Recorder

REPO = repo_root()


def test_routes_come_from_the_template_http_api_events():
    # Given the template's functions
    functions = functions_from_template(load_template(REPO / "template.yaml"), REPO)
    # When the routes are read from their HttpApi events
    routes = routes_from_functions(functions.values())
    # Then every API route of the spec is there, with its route key
    keys = {route.route_key for route in routes}
    assert {
        "POST /v1/batches",
        "GET /v1/batches",
        "GET /v1/batches/{batch_id}",
        "GET /v1/batches/{batch_id}/results",
        "POST /v1/batches/{batch_id}/cancel",
        "POST /v1/batches/{batch_id}/retry",
        "DELETE /v1/batches/{batch_id}",
    } <= keys


def test_the_template_sends_a_method_a_path_does_not_declare_to_the_api_and_unknown_paths_nowhere():
    # Given the template's routes
    routes = routes_from_functions(functions_from_template(load_template(REPO / "template.yaml"), REPO).values())
    # Then a declared method takes its own route, any other its path's ANY route (the API
    # function, which answers 405 with Allow), and a path we do not have none (API Gateway's 404)
    assert select_route(routes, "GET", "/v1/batches")[0].route_key == "GET /v1/batches"
    for method in ("PUT", "PATCH", "TRACE", "HEAD", "OPTIONS"):
        assert select_route(routes, method, "/v1/batches")[0].route_key == "ANY /v1/batches"
    assert select_route(routes, "GET", "/v1/batches/b1/cancel")[0].route_key == "ANY /v1/batches/{batch_id}/cancel"
    assert select_route(routes, "POST", "/v1/batches/b1/retry")[0].route_key == "POST /v1/batches/{batch_id}/retry"
    assert select_route(routes, "GET", "/v1/batches/b1/retry")[0].route_key == "ANY /v1/batches/{batch_id}/retry"
    assert select_route(routes, "PUT", "/v1/webhook_endpoints/we_1/test")[0].route_key \
        == "ANY /v1/webhook_endpoints/{endpoint_id}/test"
    assert select_route(routes, "PUT", "/v1/nothing") is None
    assert select_route(routes, "PUT", "/v1/batches/b1/results/more") is None
    api_any = {route.route_key for route in routes if route.method == "ANY"}
    declared_paths = {route.path for route in routes if route.method != "ANY" and route.path.startswith("/v1/")}
    assert api_any == {f"ANY {path}" for path in declared_paths}


def test_most_specific_route_wins_and_default_catches_the_rest():
    handler = Recorder()
    routes = [
        Route("ANY", "$default", handler),
        Route("ANY", "/v1/{proxy+}", handler),
        Route("GET", "/v1/batches/{batch_id}", handler),
        Route("ANY", "/v1/batches/{batch_id}", handler),
        Route("GET", "/v1/batches/special", handler),
    ]
    assert select_route(routes, "GET", "/v1/batches/special")[0].route_key == "GET /v1/batches/special"
    route, params = select_route(routes, "GET", "/v1/batches/b1")
    assert (route.route_key, params) == ("GET /v1/batches/{batch_id}", {"batch_id": "b1"})
    assert select_route(routes, "PUT", "/v1/batches/b1")[0].route_key == "ANY /v1/batches/{batch_id}"
    route, params = select_route(routes, "GET", "/v1/a/b/c")
    assert (route.route_key, params) == ("ANY /v1/{proxy+}", {"proxy": "a/b/c"})
    assert select_route(routes, "GET", "/elsewhere")[0].route_key == "$default"
    assert select_route(routes[2:], "GET", "/v1/batches/b1/extra") is None
