"""SSRF guard for outbound webhooks: which URLs and addresses a tenant may make Tick call.

The check that matters happens at connect time (`resolve_target`): the host is resolved once,
every resolved address is checked, and the caller connects to a checked address literal, so
DNS rebinding between "check" and "connect" is impossible. `check_url` is the cheap,
DNS-free part, also used when a schedule is created.

Always refused: URLs the parser cannot take apart, schemes other than http/https,
credentials in the URL, and ports other than 80 and 443 unless the tenant's
`webhook_allowed_ports` names them (docs/decisions.md "Webhook ports"). Refused unless an
operator allowlist (`TICK_WEBHOOK_ALLOWLIST`) says otherwise: loopback, private, link-local,
CGNAT, multicast, unspecified, reserved/documentation ranges, the same addresses hidden in
IPv6 wrappers (IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96, 6to4 2002::/16, Teredo) and
IPv4 spelled any way but dotted decimal (2130706433, 0x7f.1, 0177.0.0.1, 127.1).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class SSRFRefused(ValueError):
    """The URL or one of its resolved addresses is not allowed as a webhook target."""


# The ports every tenant's webhooks may call; others only through the tenant's allowlist.
DEFAULT_PORTS = frozenset({80, 443})
# Characters left as they are when a non-ASCII request path is percent-encoded.
_URL_SAFE = "/?&=:;@!$'()*+,~%#[]"


# Belt and braces next to `is_global`, whose lists changed between Python patch releases.
_BLOCKED: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
        "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "64:ff9b:1::/48", "100::/64", "2001:db8::/32", "fc00::/7",
        "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)
_DOTTED_DECIMAL = re.compile(r"^(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])$")


@dataclass(frozen=True)
class Allowlist:
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """CIDRs / addresses become networks; anything else is an exact host name."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower-case, no brackets, no trailing dot
    port: int
    request_path: str  # path + query, never empty
    host_header: str


@dataclass(frozen=True)
class ResolvedTarget:
    target: Target
    address: IPAddress  # the checked address to connect to


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    packed = int(address)
    if packed >> 32 == 0 and packed > 1:  # deprecated IPv4-compatible ::a.b.c.d
        found.append(ipaddress.IPv4Address(packed & 0xFFFFFFFF))
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(packed & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address in _TEREDO and address.teredo is not None:
        found.extend(address.teredo)
    return found


def address_refusal(address: IPAddress, allowlist: Allowlist) -> str | None:
    """Why `address` may not be called, or None when it may."""
    if allowlist.allows_address(address):
        return None
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner:
            # The wrapper is only a route to the embedded address: judge that one.
            candidates = list(inner)
    for candidate in candidates:
        if allowlist.allows_address(candidate):
            continue
        if any(candidate in net for net in _BLOCKED if net.version == candidate.version):
            return f"{address} is a non-public address ({candidate})"
        if (
            not candidate.is_global
            or candidate.is_multicast
            or candidate.is_reserved
            or candidate.is_unspecified
        ):
            return f"{address} is not a public unicast address"
    return None


def _literal_address(host: str) -> IPAddress | None:
    """The host as an IP literal (canonical forms only), None for a name; refuses the
    numeric spellings that resolvers accept (inet_aton: 2130706433, 0x7f.1, 0177.0.0.1)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    labels = host.split(".")
    if any(_NUMERIC_LABEL.match(label) for label in labels[-1:]) or all(
        _NUMERIC_LABEL.match(label) for label in labels if label
    ):
        if len(labels) != 4 or not all(_DOTTED_DECIMAL.match(label) for label in labels):
            raise SSRFRefused(f"host {host!r} is an IPv4 address in a non-standard spelling")
    return None


def check_url(url: str, *, allowlist: Allowlist, extra_ports: Collection[int] = ()) -> Target:
    """Parse and check what can be checked without DNS (scheme, credentials, port, literals).

    Any URL the parser cannot take apart (`http://[::1/`, `http://[abc]/`, a host that is
    no IDNA name) is refused here like any other bad target, never an unexpected error: at
    create time it is a field error, at send time a permanent failure. The port must be
    80, 443 or one of `extra_ports` (the tenant's `webhook_allowed_ports`)."""
    if not isinstance(url, str) or len(url) > 2048:
        raise SSRFRefused("url must be a string of at most 2048 characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise SSRFRefused("url must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
        hostname, explicit_port = parts.hostname, parts.port
    except ValueError as exc:  # unbalanced brackets, a bracketed non-address, a bad port
        raise SSRFRefused(f"url is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise SSRFRefused(f"scheme {parts.scheme!r} is not allowed (http or https only)")
    if parts.username is not None or parts.password is not None:
        raise SSRFRefused("credentials in the url are not allowed (use headers)")
    default_port = 443 if scheme == "https" else 80
    port = default_port if explicit_port is None else explicit_port
    if port not in DEFAULT_PORTS and port not in extra_ports:
        raise SSRFRefused(
            f"port {port} is not allowed (80 and 443 only, unless the tenant's webhook port "
            "allowlist names it)"
        )
    host = _ascii_host((hostname or "").rstrip("."), bracketed="[" in parts.netloc)
    if host not in allowlist.hosts:
        literal = _literal_address(host)
        if literal is not None:
            reason = address_refusal(literal, allowlist)
            if reason is not None:
                raise SSRFRefused(reason)
    path = parts.path or "/"
    request_path = f"{path}?{parts.query}" if parts.query else path
    if not request_path.isascii():
        # The request line is sent as ASCII: non-ASCII characters are percent-encoded here
        # (as a browser would) instead of failing at send time.
        request_path = quote(request_path, safe=_URL_SAFE)
    netloc_host = f"[{host}]" if ":" in host else host
    host_header = netloc_host if port == default_port else f"{netloc_host}:{port}"
    return Target(scheme, host, port, request_path, host_header)


def _ascii_host(host: str, *, bracketed: bool) -> str:
    """The host lower-cased in its ASCII (IDNA) form, as DNS and the Host header carry it;
    a bracketed host must be an IPv6 address (never an IPvFuture or a name)."""
    if not host:
        raise SSRFRefused("url has no host")
    if bracketed:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise SSRFRefused(f"host [{host}] is not an IPv6 address") from None
        return host.lower()
    try:
        # Also for ASCII: the codec refuses empty and over-long labels, which the resolver
        # would otherwise reject with an unexpected error at each send.
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise SSRFRefused(f"host {host!r} is not a valid domain name") from None


def _resolve(host: str, port: int) -> Sequence[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def resolve_target(
    url: str, *, allowlist: Allowlist, extra_ports: Collection[int] = ()
) -> ResolvedTarget:
    """Check the URL, resolve its host once and check every address (connect-time guard).

    Every address must pass: a name that resolves to one public and one private address is
    refused, so the choice of address can never be steered towards the private one.
    Raises SSRFRefused, or OSError (socket.gaierror) when the name does not resolve.
    """
    target = check_url(url, allowlist=allowlist, extra_ports=extra_ports)
    addresses = _resolve(target.host, target.port)
    if not addresses:
        raise OSError(f"{target.host} did not resolve")
    if target.host not in allowlist.hosts:
        for address in addresses:
            reason = address_refusal(address, allowlist)
            if reason is not None:
                raise SSRFRefused(f"{target.host} resolves to {reason}")
    return ResolvedTarget(target, addresses[0])
