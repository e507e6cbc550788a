"""Webhook URL rules (webhooks/urls.py), without AWS: which URLs are refused and why, names resolved
through an injected resolver, the address checked being the one called, and loopback http only in
the local setting."""

from __future__ import annotations

import pytest
from freeinference_batch.webhooks import urls


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


