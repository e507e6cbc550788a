"""`freeinference-batch webhooks add / list / delete / test`: the account's webhook endpoints."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import click

from freeinference_batch_client.cli.common import echo_err, friendly_errors, make_client
from freeinference_batch_client.client import WEBHOOK_EVENT_TYPES
from freeinference_batch_client.models import WebhookEndpoint


@click.group()
def webhooks() -> None:
    """Webhook endpoints: URLs told, with a signed event, when one of your batches ends."""


def _endpoint_line(endpoint: WebhookEndpoint) -> str:
    return (f"{endpoint.id}  {endpoint.url}  {','.join(endpoint.event_types)}  {endpoint.name!r}  "
            f"secret {endpoint.signing_secret_hint}")


@webhooks.command(name="add")
@click.argument("url")
@click.option("--name", default=None, help="A name to tell endpoints apart (default: the URL's host).")
@click.option("--event-type", "event_types", multiple=True, type=click.Choice(WEBHOOK_EVENT_TYPES),
              help="An event to send (repeatable); default: all four.")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint object as JSON (with its secret).")
@friendly_errors
def add_webhook(url: str, name: str | None, event_types: tuple[str, ...], as_json: bool) -> None:
    """Register URL; prints its signing secret, which is shown this once."""
    endpoint = make_client().webhooks.create(url, name or (urlsplit(url).hostname or url),
                                             event_types or WEBHOOK_EVENT_TYPES)
    if as_json:
        click.echo(json.dumps(endpoint.model_dump(mode="json")))
        return
    click.echo(_endpoint_line(endpoint))
    click.echo(f"signing secret: {endpoint.signing_secret}")
    # On stderr: stdout stays the endpoint and its secret, for a script to read.
    echo_err("Keep the signing secret now: it is shown only this once (a new one: rotate it).")


@webhooks.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint objects as JSON, one per line.")
@friendly_errors
def list_webhooks(as_json: bool) -> None:
    """Your webhook endpoints (never their secrets)."""
    for endpoint in make_client().webhooks.iter():
        # The server never lists a secret; the model's empty field is left out, not printed as null.
        click.echo(json.dumps(endpoint.model_dump(mode="json", exclude={"signing_secret"})) if as_json
                   else _endpoint_line(endpoint))


@webhooks.command(name="delete")
@click.argument("endpoint_id")
@friendly_errors
def delete_webhook(endpoint_id: str) -> None:
    """Delete an endpoint; its pending deliveries stop."""
    click.echo(f"{make_client().webhooks.delete(endpoint_id).id}  deleted")


@webhooks.command(name="test")
@click.argument("endpoint_id")
@click.option("--event-type", type=click.Choice(WEBHOOK_EVENT_TYPES), default="batch.completed", show_default=True)
@friendly_errors
def test_webhook(endpoint_id: str, event_type: str) -> None:
    """Send one signed test event now; prints what the receiver answered, exit 1 unless a 2xx."""
    result = make_client().webhooks.test(endpoint_id, event_type)
    click.echo(f"{result.webhook_endpoint_id}  {result.event_type}  the receiver answered {result.status_code}")
    if not 200 <= result.status_code < 300:
        raise click.exceptions.Exit(1)
