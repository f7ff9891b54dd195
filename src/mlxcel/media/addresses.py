"""Which addresses a fetch may connect to: public unicast only, unless the host is listed."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

from mlxcel.media.policy import MediaError, MediaPolicy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

# Cloud metadata services that are not in a private or link-local range (Alibaba's sits in
# 100.64.0.0/10, which is not global anyway; listed so the refusal names it).
_METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address DNS gives for `host` (an IP literal resolves to itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise MediaError(
            f"could not resolve media host {host!r}: {exc}", "media_fetch_failed"
        ) from exc
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in found:
            found.append(address)
    return found


def refusal(address: IPAddress) -> str | None:
    """Why a fetch may not connect to `address`, or None when it is public unicast."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in _METADATA:
        return "a cloud metadata address"
    for why, test in (
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("an unspecified address", address.is_unspecified),
        ("a private address", address.is_private),
    ):
        if test:
            return why
    if not address.is_global:
        return "a reserved address"
    return None


async def checked_address(
    host: str, port: int, policy: MediaPolicy, resolver: Resolver
) -> IPAddress:
    """Resolve `host` once and check every answer; the address to connect to.

    All answers must pass, not just the one used: a name that also points inside the network
    is refused whichever answer a later lookup would give.
    """
    addresses = await resolver(host, port)
    if not addresses:
        raise MediaError(f"media host {host!r} has no address", "media_fetch_failed")
    if not policy.host_allowed(host):
        for address in addresses:
            why = refusal(address)
            if why is not None:
                raise MediaError(
                    f"media URL host {host!r} resolves to {address}, {why}; "
                    "list the host in --media-allow-hosts to fetch from it",
                    "media_not_allowed",
                )
    return addresses[0]
