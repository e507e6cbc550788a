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
    return urls.check_url(url, allow_loopback_http=loopback, resolver=resolver,
                          loopback_ports=urls.parse_ports("9000-9099,7000"))


@pytest.mark.parametrize(("url", "addresses", "why"), [
    ("http://example.com/hook", (), "must use https"),
    ("http://127.0.0.1:8000/hook", (), "must use https"),  # the deployed setting
    ("https://user:pw@example.com/hook", (), "credentials"),
    ("ftp://example.com/", (), "https:// URL"),
    ("https://10.0.0.1/", ("10.0.0.1",), "resolves to a private address"),
    ("https://hooks.example.com/", ("127.0.0.1",), "resolves to a loopback address"),
    ("https://hooks.example.com/", ("169.254.169.254",), "resolves to a link-local address"),
    ("https://hooks.example.com/", ("93.184.215.14", "192.168.1.4"), "resolves to a private address"),
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
    with pytest.raises(urls.UrlRefused, match=why.replace(".", r"\.")) as refused:
        check(url, *addresses)
    # What a name resolves to is never told: it would map a VPC's private zones for anyone
    host = url.split("//", 1)[1].split("/", 1)[0]
    assert not [a for a in addresses if a not in host and a in str(refused.value)], refused.value


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
    # localhost is loopback whatever a resolver (or /etc/hosts) says
    assert check("http://localhost:9000/h", "10.1.1.1", loopback=True).address == "127.0.0.1"
    with pytest.raises(urls.UrlRefused, match="must use https"):
        check("http://example.com/h", loopback=True)




def test_loopback_receivers_are_called_on_the_configured_ports_only() -> None:
    # With LOCAL_STACK_HOST=0.0.0.0 a key holder must not POST to the stack's own services (or any
    # other on the machine): only the ports WEBHOOK_LOOPBACK_PORTS names
    assert check("http://127.0.0.1:7000/h", loopback=True).port == 7000
    for url in ("http://127.0.0.1:8080/v1/batches", "http://localhost:5000/", "http://[::1]:9100/", "http://127.0.0.1/"):
        with pytest.raises(urls.UrlRefused, match=r"port must be one of WEBHOOK_LOOPBACK_PORTS \(9000-9099, 7000"):
            check(url, loopback=True)


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "127.1", "0177.0.0.1"])
def test_numeric_ipv4_forms_are_judged_as_the_address_they_name_without_dns(host: str) -> None:
    def no_dns(name: str, port: int) -> list[str]:
        raise AssertionError("resolved")

    with pytest.raises(urls.UrlRefused, match="a loopback address"):
        urls.check_url(f"https://{host}/", allow_loopback_http=False, resolver=no_dns)


def test_an_international_name_is_resolved_and_called_as_its_idna_form() -> None:
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["93.184.215.14"]

    checked = urls.check_url("https://Bücher.example/hook", allow_loopback_http=False, resolver=resolver)
    assert asked == ["xn--bcher-kva.example"]
    assert (checked.host, checked.host_header) == ("xn--bcher-kva.example", "xn--bcher-kva.example")
    with pytest.raises(urls.UrlRefused, match="not a valid international domain name"):
        urls.check_url("https://a\u200db.example/", allow_loopback_http=False, resolver=resolver)


def test_a_resolver_that_does_not_answer_is_given_up_on_time(monkeypatch) -> None:
    import socket
    import time

    import dns.resolver

    # A name server that never answers
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port = ["127.0.0.1"], silent.getsockname()[1]
    monkeypatch.setattr(urls, "_dns", lambda: resolver)
    try:
        started = time.monotonic()
        with pytest.raises(urls.UrlRefused, match="did not resolve in time"):
            urls.check_url("https://hooks.example.com/", allow_loopback_http=False, resolver=urls.dns_resolver(0.5))
        assert time.monotonic() - started < 1.5
    finally:
        silent.close()
