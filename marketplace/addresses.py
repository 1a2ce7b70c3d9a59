"""Addresses strangers give the site for others to dial: a worker's relay (its chain child connects to it), the
learner's relay hub and its snapshot URL (agents connect and download). An address that points into the dialer's
own machine or network would turn agents into probes of it: link-local ranges and cloud metadata endpoints are
always refused, loopback and private ranges unless a setting allows them (tests and the demo run on loopback).

Host names are checked as names (``localhost``, metadata names), not resolved: what a name resolves to at the
site says nothing of what it resolves to at the agent. Pure functions; the serializers call them with the
settings ``ECHO2_ALLOW_LOOPBACK_PEERS`` and ``ECHO2_ALLOW_PRIVATE_PEERS``.
"""

from __future__ import annotations

import ipaddress
import re
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
        return _check_name(host, policy)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    _check_ip(mapped or ip, policy)  # ::ffff:169.254.169.254 is 169.254.169.254
    return host


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
