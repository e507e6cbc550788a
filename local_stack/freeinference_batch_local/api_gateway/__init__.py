"""API Gateway's HTTP API, emulated: HTTP requests -> payload 2.0 events -> the function -> HTTP.

`routes.py` picks the route as HTTP API does, `integration.py` builds the event, invokes the
Lambda integration with Lambda's and HTTP API's limits and turns its answer into HTTP,
`server.py` is the HTTP server. A route's handler is, in the local stack, the function's
`EnvironmentPool` (environments.py): each request is an invocation in an execution environment
of its own, and a failed invocation (an exception, a timeout, a process that died) is the
handler raising, so a 500 as on AWS.

What it does not emulate: authorizers, CORS, throttling, the custom domain and stages.
"""
