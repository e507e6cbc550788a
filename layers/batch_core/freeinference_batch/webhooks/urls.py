"""Which webhook URLs we may call, and calling one at exactly the address that was checked.

A webhook URL is chosen by a user and called by us from inside AWS, so it must not reach what
only we can reach (the instance metadata service at 169.254.169.254, a VPC's private addresses,
loopback). `check_url` refuses, at registration and again before every delivery:

- any scheme but `https` (the local stack's setting `WEBHOOK_ALLOW_LOOPBACK_HTTP` also allows
  `http` to the literal hosts 127.0.0.1, ::1 and localhost, so a developer can receive events);
- credentials in the URL (`https://user:pass@...`);
- a host that resolves to any address that is not public: private, loopback, link-local,
  multicast, reserved, unspecified, shared (100.64/10) ... (`ipaddress`'s `is_global`), an
  IPv4-mapped IPv6 address judged as the IPv4 address it maps. Every address the name resolves to
  is checked, not one: a name with a public and a private address is refused.

`post` then connects to the checked address itself (TLS still verified against the URL's host
name, sent as SNI and Host), so a name that resolves to something else a moment later (DNS
rebinding) changes nothing. Redirects are never followed. The resolver is a parameter so that
tests can make a name resolve anywhere without a DNS server.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

MAX_URL_LENGTH = 2048
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
# The ports an https receiver may listen on (the common TLS ones).
WEBHOOK_PORTS = frozenset({443, 8443})

# host, port -> the addresses it resolves to.
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class UrlRefused(ValueError):
    """A URL we will not call; the message says why, in words a user can act on."""


@dataclass(frozen=True)
class CheckedUrl:
    """A URL that passed `check_url`, and the address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    address: str
    target: str  # path and query, as sent in the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def _not_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What kind of address we refuse `address` as, or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv6 form that carries an IPv4 address (mapped, 6to4, Teredo's client) reaches that
        # address: judge it as that one. Site-local is refused outright: Python's tables for it
        # differ between 3.11 (tests) and 3.13 (Lambda), and the rule must not.
        if address.is_site_local:
            return "site-local"
        carried = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if carried is not None:
            address = carried
    # Link-local before private: Python counts 169.254/16 as both, and the metadata address is
    # what a user should read in the message.
    for kind, test in (("loopback", address.is_loopback), ("link-local", address.is_link_local),
                       ("multicast", address.is_multicast), ("unspecified", address.is_unspecified),
                       ("private", address.is_private), ("reserved", address.is_reserved)):
        if test:
            return kind
    return None if address.is_global else "reserved"


def check_url(url: str, *, allow_loopback_http: bool, resolver: Resolver = system_resolver) -> CheckedUrl:
    """The URL and the address to call it at, or UrlRefused saying why not."""
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"it is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port_given = parts.port
    except ValueError as error:
        raise UrlRefused(f"it is not a valid URL ({error})") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise UrlRefused("it must be an https:// URL with a host name")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("it must not hold credentials (user:password@)")
    if parts.fragment:
        raise UrlRefused("it must not have a #fragment")
    loopback_allowed = allow_loopback_http and host in LOOPBACK_HOSTS
    if parts.scheme != "https" and not loopback_allowed:
        raise UrlRefused("it must use https://")
    port = port_given or (443 if parts.scheme == "https" else 80)
    if not loopback_allowed and port not in WEBHOOK_PORTS:
        # Any other port would let a key holder probe services on public hosts from our
        # addresses, the test route telling open from closed.
        raise UrlRefused(f"its port must be one of {', '.join(map(str, sorted(WEBHOOK_PORTS)))} (got {port})")
    try:
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(host, port)]
    except (OSError, ValueError):
        addresses = []
    if not addresses:
        raise UrlRefused(f"its host {host} does not resolve to any address")
    for address in addresses:
        if loopback_allowed:
            if not address.is_loopback:
                raise UrlRefused(f"its host {host} resolves to {address}, which is not a loopback address")
            continue
        kind = _not_public(address)
        if kind is not None:
            article = "an" if kind[0] in "aeiou" else "a"
            raise UrlRefused(f"its host {host} resolves to {address}, {article} {kind} address")
    # IPv4 first: Lambda functions outside a VPC have no IPv6 egress.
    address = str(sorted(addresses, key=lambda a: a.version)[0])
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return CheckedUrl(url=url, scheme=parts.scheme, host=host, port=port, address=address, target=target)


class _PinnedAdapter(HTTPAdapter):
    """Connects to the URL's IP address literal, but verifies the certificate of, and sends SNI
    for, the host name that was checked."""

    def __init__(self, host: str) -> None:
        self._host = host
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs["server_hostname"] = self._host
        kwargs["assert_hostname"] = self._host
        super().init_poolmanager(*args, **kwargs)


@dataclass(frozen=True)
class Answer:
    """What one attempt got: a status, or the reason there was none (`status` is None)."""

    status: int | None
    failure: str = ""
    # The attempt could not reach the receiver (timeout, refused connection): the endpoint is
    # probably down, and other deliveries to it should not spend their time finding that out.
    unreachable: bool = False

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post(checked: CheckedUrl, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST `body` to the checked address; never follows a redirect (a 3xx is not delivered)."""
    literal = f"[{checked.address}]" if ":" in checked.address else checked.address
    url = f"{checked.scheme}://{literal}:{checked.port}{checked.target}"
    with requests.Session() as session:
        session.trust_env = False  # no proxy from the environment: we call the checked address
        session.mount(f"{checked.scheme}://", _PinnedAdapter(checked.host))
        try:
            # The status line is the whole answer we need: the body is never read (a receiver
            # trickling one would hold the attempt a timeout per read), the connection just closed.
            with session.post(url, data=body, headers={**headers, "Host": checked.host_header},
                              timeout=timeout, allow_redirects=False, stream=True) as response:
                return Answer(status=response.status_code)
        except (requests.Timeout, requests.ConnectionError):
            # One message for both: telling a refused connection from a silent one would make the
            # test route a port scanner.
            return Answer(status=None, failure=f"no answer within {timeout:g} s, or the connection was refused",
                          unreachable=True)
        except requests.RequestException as error:
            return Answer(status=None, failure=f"the request failed ({type(error).__name__})")
