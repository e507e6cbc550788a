"""Which webhook URLs we may call, and the address to call each one at.

A webhook URL is chosen by a user and called by us from inside AWS, so it must not reach what
only we can reach (the instance metadata service at 169.254.169.254, a VPC's private addresses,
loopback). `check_url` refuses, at registration and again before every delivery:

- any scheme but `https` (the local stack's setting `WEBHOOK_ALLOW_LOOPBACK_HTTP` also allows
  `http` to the literal hosts 127.0.0.1, ::1 and localhost, so a developer can receive events,
  on the ports `WEBHOOK_LOOPBACK_PORTS` names only: the stack's own services and whatever else
  listens on the machine are not a key holder's to POST to);
- credentials in the URL (`https://user:pass@...`);
- a host that resolves to any address that is not public: private, loopback, link-local,
  multicast, reserved, unspecified, shared (100.64/10) ... (`ipaddress`'s `is_global`), an
  IPv4-mapped IPv6 address judged as the IPv4 address it maps. Every address the name resolves to
  is checked, not one: a name with a public and a private address is refused. The message says
  which kind of address, never the address (that would map a VPC's private zones for anyone).

Names are resolved by dnspython within a deadline (`getaddrinfo` has none, and a thread stuck in
it cannot be stopped); an international name is resolved, and called, as its `xn--` (IDNA) form;
numeric IPv4 forms (`127.1`, `0x7f000001`, `2130706433`) are read as the C library reads them,
without DNS. The sender (sender.py) then connects to the checked address itself (TLS still
verified against the URL's host name, sent as SNI and Host), so a name that resolves to something
else a moment later (DNS rebinding) changes nothing. Redirects are never followed. The resolver is
a parameter so that tests can make a name resolve anywhere without a DNS server.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

import dns.exception
import dns.resolver
import idna

MAX_URL_LENGTH = 2048
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
# The ports an https receiver may listen on (the common TLS ones).
WEBHOOK_PORTS = frozenset({443, 8443})
# How long a name may take to resolve (both its A and AAAA records) unless told otherwise.
RESOLVE_SECONDS = 2.0
_NUMERIC_IPV4 = re.compile(r"[0-9a-fA-FxX.]+")

# host, port -> the addresses it resolves to; OSError when it cannot say.
Resolver = Callable[[str, int], list[str]]


class ResolveTimeout(OSError):
    """The name did not resolve within its deadline."""


@lru_cache(maxsize=1)
def _dns() -> dns.resolver.Resolver:
    return dns.resolver.Resolver()  # /etc/resolv.conf, read once per environment


def dns_resolver(lifetime: float = RESOLVE_SECONDS) -> Resolver:
    """A resolver that answers within `lifetime` seconds in all (A, then AAAA with what is left)."""

    def resolve(host: str, port: int) -> list[str]:
        deadline = time.monotonic() + lifetime
        try:
            resolver = _dns()
        except dns.exception.DNSException as error:
            raise OSError(f"no resolver ({type(error).__name__})") from None
        addresses: list[str] = []
        for record_type in ("A", "AAAA"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResolveTimeout
            try:
                answer = resolver.resolve(host, record_type, lifetime=left, search=False)
            except dns.resolver.NoAnswer:
                continue
            except dns.resolver.NXDOMAIN:
                return []
            except dns.exception.Timeout:
                raise ResolveTimeout from None
            except dns.exception.DNSException as error:
                raise OSError(type(error).__name__) from None
            addresses += [record.address for record in answer]
        return addresses

    return resolve


system_resolver: Resolver = dns_resolver()


def parse_ports(text: str) -> tuple[range, ...]:
    """`WEBHOOK_LOOPBACK_PORTS`: ports and ranges, as "9000-9999,8000"."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        ranges.append(range(int(low), int(high or low) + 1))
    return tuple(ranges)


def _literal(host: str) -> list[str] | None:
    """The address a host that is an address literal names (IPv6, dotted IPv4, and the C library's
    other IPv4 forms), or None for a name."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    if _NUMERIC_IPV4.fullmatch(host):
        try:
            return [socket.inet_ntoa(socket.inet_aton(host))]
        except OSError:
            return None
    return None


def _ascii_host(host: str) -> str:
    if host.isascii():
        return host
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError:
        raise UrlRefused("its host is not a valid international domain name") from None


class UrlRefused(ValueError):
    """A URL we will not call; the message says why, in words a user can act on."""


@dataclass(frozen=True)
class CheckedUrl:
    """A URL that passed `check_url`, and the address to connect to."""

    url: str
    scheme: str
    host: str  # ASCII: an international name in its xn-- form
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


def check_url(url: str, *, allow_loopback_http: bool, resolver: Resolver = system_resolver,
              loopback_ports: tuple[range, ...] = ()) -> CheckedUrl:
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
    host = _ascii_host(host)
    loopback_allowed = allow_loopback_http and host in LOOPBACK_HOSTS
    if parts.scheme != "https" and not loopback_allowed:
        raise UrlRefused("it must use https://")
    port = port_given or (443 if parts.scheme == "https" else 80)
    if loopback_allowed and not any(port in allowed for allowed in loopback_ports):
        # Whatever else listens on the developer's machine (the local stack's own services
        # among it) is not a key holder's to POST to, least of all with LOCAL_STACK_HOST=0.0.0.0.
        named = ", ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in loopback_ports)
        raise UrlRefused(f"a loopback receiver's port must be one of WEBHOOK_LOOPBACK_PORTS ({named or 'none'}; "
                         f"got {port})")
    if not loopback_allowed and port not in WEBHOOK_PORTS:
        # Any other port would let a key holder probe services on public hosts from our
        # addresses, the test route telling open from closed.
        raise UrlRefused(f"its port must be one of {', '.join(map(str, sorted(WEBHOOK_PORTS)))} (got {port})")
    literal = ["127.0.0.1", "::1"] if host == "localhost" else _literal(host)
    try:
        found = literal if literal is not None else resolver(host, port)
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
    except ResolveTimeout:
        raise UrlRefused(f"its host {host} did not resolve in time") from None
    except (OSError, ValueError):
        addresses = []
    if not addresses:
        raise UrlRefused(f"its host {host} does not resolve to any address")
    for address in [] if loopback_allowed else addresses:  # loopback hosts are literals, never resolved
        kind = _not_public(address)
        if kind is not None:
            article = "an" if kind[0] in "aeiou" else "a"
            raise UrlRefused(f"its host {host} resolves to {article} {kind} address")
    # IPv4 first: Lambda functions outside a VPC have no IPv6 egress.
    address = str(sorted(addresses, key=lambda a: a.version)[0])
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return CheckedUrl(url=url, scheme=parts.scheme, host=host, port=port, address=address, target=target)
