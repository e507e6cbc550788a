"""HTTP API's routes: route matching as API Gateway does it (most specific route first, then
`$default`, else 404 `{"message":"Not Found"}`), path parameters, and the routes of the
template's functions' `HttpApi` events."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from freeinference_batch_local.handlers import FunctionSpec, LambdaContext


@dataclass
class Route:
    """One HTTP API route: `method` (or ANY) and `path` with `{name}` / `{name+}`, or `$default`."""

    method: str
    path: str
    handler: Callable[[dict, Any], Any]
    context_factory: Callable[[], Any] = field(default=lambda: LambdaContext("local-api", 128, 29))
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False)
    _rank: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.method = self.method.upper()
        if self.method in {"*", "X-AMAZON-APIGATEWAY-ANY-METHOD"}:
            self.method = "ANY"
        if self.path == "$default":
            self._rank = (9, 0, 0, 0)
            return
        parts, greedy, variables = [], 0, 0
        for segment in self.path.strip("/").split("/"):
            variable = re.fullmatch(r"\{([^{}+]+)(\+?)\}", segment)
            if variable and variable.group(2):
                parts.append(f"(?P<{_group(variable.group(1))}>.+)")
                greedy += 1
            elif variable:
                parts.append(f"(?P<{_group(variable.group(1))}>[^/]+)")
                variables += 1
            else:
                parts.append(re.escape(segment))
        self._pattern = re.compile("/" + "/".join(parts))
        # API Gateway prefers full matches, then fewer variables, greedy last; a method over ANY.
        self._rank = (greedy, variables, -len(self.path), int(self.method == "ANY"))

    @property
    def route_key(self) -> str:
        return "$default" if self.path == "$default" else f"{self.method} {self.path}"

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if self.method not in {"ANY", method}:
            return None
        if self._pattern is None:
            return {}
        found = self._pattern.fullmatch(path)
        if found is None:
            return None
        return {_ungroup(name): unquote(value) for name, value in found.groupdict().items()}


def _group(name: str) -> str:
    return "p_" + name.encode().hex()


def _ungroup(group: str) -> str:
    return bytes.fromhex(group[2:]).decode()


def select_route(routes: Iterable[Route], method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    best = None
    for route in routes:
        params = route.match(method, path)
        if params is not None and (best is None or route._rank < best[0]._rank):
            best = (route, params)
    return best


def routes_from_functions(
    functions: Iterable[FunctionSpec], invoker: Callable[[FunctionSpec], Callable[[dict, Any], Any]] | None = None
) -> list[Route]:
    """A Route per `HttpApi` event of the template's functions (no Path/Method means `$default`).

    `invoker(function)` is what a route calls: the function's `EnvironmentPool` (each request in
    an execution environment of its own), or by default the handler itself, in this process."""
    routes = []
    for function in functions:
        for properties in function.events("HttpApi").values():
            path = properties.get("Path")
            method = properties.get("Method")
            if not path and not method:
                path, method = "$default", "ANY"
            routes.append(
                Route(
                    method=str(method or "ANY"),
                    path=str(path or "/"),
                    handler=invoker(function) if invoker is not None else function.handler,
                    context_factory=function.context,
                )
            )
    return routes
