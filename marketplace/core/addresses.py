"""Addresses strangers give the site for others to dial: a worker's relay (its chain child connects to it), the
learner's relay hub and its snapshot URL (agents connect and download). An address that points into the dialer's
own machine or network would turn agents into probes of it: link-local ranges and cloud metadata endpoints are
always refused, loopback and private ranges unless a setting allows them (tests and the demo run on loopback).

Host names are checked as names (``localhost``, metadata names), not resolved: what a name resolves to at the
site says nothing of what it resolves to at the agent. A host that is a number in any form a resolver takes as an
IPv4 address (``inet_aton``: ``2852039166``, ``0xa9fea9fe``, ``127.1``, ``0177.0.0.1``, ``0``) is that address and
checked as one; a host whose last label is a number but is no such address is refused, as browsers do
(WHATWG URL). An IPv6 address that carries an IPv4 one (``::ffff:a.b.c.d``, NAT64's ``64:ff9b::a.b.c.d``) is
checked as the IPv4 address it reaches. Pure functions; the serializers call them with the
settings ``ECHO2_ALLOW_LOOPBACK_PEERS`` and ``ECHO2_ALLOW_PRIVATE_PEERS``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

METADATA_IPS = frozenset(map(ipaddress.ip_address, ["169.254.169.254", "169.254.170.2", "100.100.100.200",
                                                     "fd00:ec2::254"]))
"""Cloud instance metadata services (AWS, GCP, Azure, ECS tasks, Alibaba; AWS over IPv6)."""
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"})
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


class AddressError(ValueError):
    """Why an address is refused, for a 400 naming the field."""


@dataclass(frozen=True)
class PeerPolicy:
    allow_loopback: bool = False
    allow_private: bool = False


def check_host(host: str, policy: PeerPolicy) -> str:
    """``host`` (an IP literal, IPv6 without brackets, or a DNS name), lower-cased, if peers may dial it."""
    host = host.strip().lower().rstrip(".")
    if not host:
        raise AddressError("no host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        numeric = numeric_ipv4(host)
        if numeric is None:
            return _check_name(host, policy)
        _check_ip(numeric, policy)
        return str(numeric)  # 127.1 is dialled as 127.0.0.1: say so
    _check_ip(_embedded_ipv4(ip) or ip, policy)  # ::ffff:169.254.169.254 is 169.254.169.254
    return host


_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): ``64:ff9b::a9fe:a9fe`` reaches 169.254.169.254 through a NAT64 gateway."""


def numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a numeric ``host`` (lower-case) means to a resolver, in every form ``inet_aton`` takes: one to
    four dot-separated numbers, each decimal, octal (a leading 0) or hex (``0x``), the last filling the bytes left
    (``127.1`` is 127.0.0.1, ``2852039166`` and ``0xa9fea9fe`` are 169.254.169.254, ``0`` is 0.0.0.0). None when
    the last label is not a number (a host name); :class:`AddressError` when it is one but the host is no address
    (``1.2.3.4.5``, ``256.1.1.1``, ``08.1``): WHATWG URL refuses such hosts, and no resolver should be asked."""
    labels = host.split(".")
    if not _NUMBER.fullmatch(labels[-1]):
        return None
    values = []
    for label in labels if len(labels) <= 4 else ():
        if not _NUMBER.fullmatch(label):
            break
        if label.startswith("0x"):
            values.append(int(label[2:] or "0", 16))
        elif len(label) > 1 and label.startswith("0"):
            if not set(label) <= set("01234567"):
                break
            values.append(int(label, 8))
        else:
            values.append(int(label))
    *head, last = values or [-1]
    if len(values) != len(labels) or any(v > 255 for v in head) or not 0 <= last < 256 ** (4 - len(head)):
        raise AddressError(f"{host!r} ends in a number but is no IPv4 address")
    return ipaddress.IPv4Address(sum(v << 8 * (3 - i) for i, v in enumerate(head)) + last)


def _embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: IPv4-mapped (``::ffff:a.b.c.d``) or through NAT64 (``64:ff9b::/96``)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None


def _check_name(host: str, policy: PeerPolicy) -> str:
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.split(".")):
        raise AddressError(f"{host!r} is neither an IP address nor a host name")
    if host in METADATA_NAMES:
        raise AddressError(f"{host} is a cloud metadata service")
    if (host == "localhost" or host.endswith(".localhost")) and not policy.allow_loopback:
        raise AddressError(f"{host} is loopback (the dialer's own machine)")
    return host


def _check_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: PeerPolicy) -> None:
    if ip in METADATA_IPS:
        raise AddressError(f"{ip} is a cloud metadata service")
    if ip.is_link_local:
        raise AddressError(f"{ip} is link-local")
    if ip.is_unspecified or ip.is_multicast or (ip.is_reserved and not ip.is_loopback):
        raise AddressError(f"{ip} is not a unicast address")
    if ip.is_loopback:
        if not policy.allow_loopback:
            raise AddressError(f"{ip} is loopback (the dialer's own machine)")
    elif not ip.is_global and not policy.allow_private:
        raise AddressError(f"{ip} is a private address, not reachable across the internet")


def check_host_port(value: str, policy: PeerPolicy) -> str:
    """``host:port`` (``[v6]:port`` for IPv6) with a port in 1..65535 and a host peers may dial; returned tidied."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host:
        raise AddressError(f"expected host:port, got {value!r}")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise AddressError(f"port must be 1-65535, got {port!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        raise AddressError(f"write an IPv6 address in brackets, [{host}]:{port}")
    host = check_host(host[1:-1] if bracketed else host, policy)
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def check_url(value: str, policy: PeerPolicy) -> str:
    """An ``http`` or ``https`` URL without credentials whose host peers may dial."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError as err:
        raise AddressError(f"malformed URL: {err}") from None
    if parts.scheme not in ("http", "https"):
        raise AddressError(f"only http and https URLs are accepted, not {parts.scheme or 'no scheme'!r}")
    if parts.username is not None or parts.password is not None:
        raise AddressError("a URL must not carry credentials")
    if port == 0:
        raise AddressError("port must be 1-65535")
    check_host(parts.hostname or "", policy)
    return value.strip()


Resolver = Callable[..., list]
"""``socket.getaddrinfo``'s shape."""


def check_dial_url(value: str, policy: PeerPolicy, *, resolve: Resolver = socket.getaddrinfo) -> str:
    """:func:`check_url` for a URL the site itself is about to dial (an export's snapshot URL), checked again at
    dial time (a URL stored before a rule, or under other settings, is not trusted) and, the site being the dialer
    this time, a host name's resolved addresses checked too: a name that resolves to the site's own machine, its
    network or a metadata service is refused like the address itself. (urllib resolves again when it connects: a
    name whose answer changes in between is not caught.)"""
    url = check_url(value, policy)
    host = (urlsplit(url).hostname or "").rstrip(".")
    try:
        ipaddress.ip_address(host)
        return url  # an IP literal: checked as one already
    except ValueError:
        if numeric_ipv4(host) is not None:
            return url
    try:
        answers = resolve(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise AddressError(f"{host} does not resolve: {err}") from None
    for *_, sockaddr in answers:
        ip = ipaddress.ip_address(sockaddr[0].partition("%")[0])
        try:
            _check_ip(_embedded_ipv4(ip) or ip, policy)
        except AddressError as err:
            raise AddressError(f"{host} resolves to {ip}: {err}") from None
    return url
