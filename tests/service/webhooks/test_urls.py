"""Webhook URL rules, signing and the retry schedule, without AWS: names resolve through an
injected resolver; signatures are verified by the `openai` package itself."""

from __future__ import annotations

import json
import time

import openai
import pytest
from freeinference_batch.core.settings import Settings
from freeinference_batch.webhooks import delivery, signing, status_events, urls


def resolving_to(*addresses: str) -> urls.Resolver:
    return lambda host, port: list(addresses)


def check(url: str, *addresses: str, loopback: bool = False) -> urls.CheckedUrl:
    resolver = resolving_to(*(addresses or ["93.184.215.14"]))
    return urls.check_url(url, allow_loopback_http=loopback, resolver=resolver)


@pytest.mark.parametrize(("url", "addresses", "why"), [
    ("http://example.com/hook", (), "must use https"),
    ("http://127.0.0.1:8000/hook", (), "must use https"),  # the deployed setting
    ("https://user:pw@example.com/hook", (), "credentials"),
    ("ftp://example.com/", (), "https:// URL"),
    ("https://10.0.0.1/", ("10.0.0.1",), "10.0.0.1, a private address"),
    ("https://hooks.example.com/", ("127.0.0.1",), "127.0.0.1, a loopback address"),
    ("https://hooks.example.com/", ("169.254.169.254",), "169.254.169.254, a link-local address"),
    ("https://hooks.example.com/", ("93.184.215.14", "192.168.1.4"), "192.168.1.4, a private address"),
    ("https://hooks.example.com/", ("::ffff:127.0.0.1",), "a loopback address"),
    ("https://hooks.example.com/", ("224.0.0.1",), "a multicast address"),
    ("https://hooks.example.com/", ("100.64.0.1",), "a reserved address"),
    ("https://hooks.example.com/", ("0.0.0.0",), "an unspecified address"),
    # IPv6 forms that carry an IPv4 address reach it, and site-local is never public, whatever
    # the Python version's tables say (3.11 here, 3.13 on Lambda).
    ("https://hooks.example.com/", ("2002:a9fe:a9fe::1",), "a link-local address"),
    ("https://hooks.example.com/", ("2001:0:4136:e378:8000:63bf:f5ff:fffe",), "a private address"),
    ("https://hooks.example.com/", ("fec0::1",), "a site-local address"),
    # Another port would make the test route a probe of public hosts' services.
    ("https://hooks.example.com:22/", ("93.184.215.14",), "port must be one of 443, 8443"),
    ("https://hooks.example.com/", ("fd00::1",), "a private address"),
    ("https://hooks.example.com/#x", (), "fragment"),
])
def test_refused_urls_say_why(url: str, addresses: tuple[str, ...], why: str) -> None:
    with pytest.raises(urls.UrlRefused, match=why.replace(".", r"\.")):
        check(url, *addresses)


def test_a_name_that_does_not_resolve_is_refused() -> None:
    def fails(host: str, port: int) -> list[str]:
        raise OSError("no such name")

    with pytest.raises(urls.UrlRefused, match="does not resolve"):
        urls.check_url("https://nowhere.example/", allow_loopback_http=False, resolver=fails)


def test_a_public_https_url_is_called_at_the_address_checked() -> None:
    checked = check("https://Hooks.Example.com:8443/in?x=1", "2606:2800:220:1::1", "93.184.215.14")
    assert (checked.host, checked.port, checked.address, checked.target) == ("hooks.example.com", 8443,
                                                                          "93.184.215.14", "/in?x=1")
    assert checked.host_header == "hooks.example.com:8443"


def test_the_local_setting_allows_loopback_http_and_nothing_else() -> None:
    assert check("http://127.0.0.1:9000/h", "127.0.0.1", loopback=True).address == "127.0.0.1"
    assert check("http://[::1]:9000/h", "::1", loopback=True).address == "::1"
    assert check("http://localhost:9000/h", "127.0.0.1", loopback=True).host == "localhost"
    with pytest.raises(urls.UrlRefused, match="not a loopback address"):
        check("http://localhost/h", "10.1.1.1", loopback=True)
    with pytest.raises(urls.UrlRefused, match="must use https"):
        check("http://example.com/h", loopback=True)


def test_every_delivery_is_verified_by_the_openai_package_with_either_secret_during_a_rotation() -> None:
    key = b"k" * 64
    old = signing.derive_secret(key, "we_1", "n1")
    new = signing.derive_secret(key, "we_1", "n2")
    assert old != new and old.startswith("whsec_") and signing.derive_secret(key, "we_1", "n1") == old
    body = delivery.event_body("evt_1", "batch.completed", "batch_x", 1_700_000_000)
    headers = signing.signed_headers([new, old], "evt_1", int(time.time()), body)
    for secret in (old, new):
        event = openai.OpenAI(api_key="x", webhook_secret=secret).webhooks.unwrap(body, headers)
        assert (event.type, event.id, event.data.id, event.object) == ("batch.completed", "evt_1", "batch_x", "event")
    other = signing.derive_secret(b"another key", "we_1", "n2")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=other).webhooks.unwrap(body, headers)


def test_retry_delays_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    settings = Settings(WEBHOOK_RETRY_BASE_SECONDS=30, WEBHOOK_RETRY_MAX_SECONDS=3600)
    assert [delivery.retry_delay(settings, n, rng=lambda: 1.0) for n in (1, 2, 3, 8, 20)] == [
        30, 60, 120, 3600, 3600]
    assert delivery.retry_delay(settings, 2, rng=lambda: 0.0) == 30  # half of 60 at least


def _image(status: str, **extra: object) -> dict:
    item = {"pk": "BATCH#batch_1", "sk": "META", "id": "batch_1", "account_id": "acct", "key_hash": "h",
            "status": status, "created_at": 10, "expires_at": 99, "window_seconds": 89, "total": 3, "id_base": 0,
            "chunk_starts": [0], "lane_widths": {"m": 1}, "ttl": 999, "completed": 2, "failed": 1,
            "cost_nano": 1500, "metadata": {"p": "q"}, **extra}
    from freeinference_batch.store.dynamo import to_item

    return to_item(item)


def test_a_stream_record_tells_a_status_change_and_nothing_else() -> None:
    record = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("in_progress"),
                                                   "NewImage": _image("completed", completed_at=20)}}
    change, _ = status_events.status_change(record)
    assert json.loads(change.model_dump_json()) == {
        "batch_id": "batch_1", "account_id": "acct", "status": "completed", "previous_status": "in_progress",
        "request_counts": {"total": 3, "completed": 2, "failed": 1}, "cost_usd": 1.5e-06, "created_at": 10,
        "metadata": {"p": "q"}}
    same = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("in_progress"), "NewImage": _image("in_progress")}}
    deleted = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("completed"), "NewImage": _image("deleted")}}
    assert status_events.status_change(same) is None and status_events.status_change(deleted) is None
    assert status_events.event_id("batch_1", "batch.completed") == status_events.event_id("batch_1", "batch.completed")
