"""Fetching a media URL safely: checked addresses, checked redirects, bounded body and time."""

from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import urljoin, urlsplit

import httpx

from mlxcel.media.addresses import IPAddress, Resolver, checked_address, resolve
from mlxcel.media.policy import MediaError, MediaPolicy

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _target(url: str, policy: MediaPolicy) -> tuple[str, str, int]:
    """The URL's scheme, host and port, once the policy allows its scheme."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "http" and not policy.allow_insecure:
        raise MediaError(
            "plain http:// media URLs are refused; use https:// or start the server with "
            "--allow-insecure-media",
            "media_not_allowed",
        )
    if scheme not in _DEFAULT_PORTS:
        raise MediaError(f"media URL scheme {scheme!r} is not fetched", "media_not_allowed")
    if not parts.hostname:
        raise MediaError("media URL has no host", "invalid_image_url")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise MediaError(f"media URL has a bad port: {exc}", "invalid_image_url") from exc
    if parts.username is not None or parts.password is not None:
        raise MediaError("media URLs with credentials are refused", "media_not_allowed")
    return scheme, parts.hostname, port


def _pinned(url: str, address: IPAddress) -> tuple[str, dict[str, str], dict[str, str]]:
    """The request that connects to the checked `address` while naming the URL's host.

    The URL's host goes in the Host header and, for HTTPS, in SNI and certificate checks, so
    no second DNS lookup happens between the check and the connection.
    """
    parts = urlsplit(url)
    host = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    pinned = parts._replace(netloc=netloc, fragment="").geturl()
    headers = {"Host": parts.netloc.rsplit("@", 1)[-1], "Accept-Encoding": "identity"}
    extensions = {"sni_hostname": parts.hostname or ""} if parts.scheme == "https" else {}
    return pinned, headers, extensions


async def _get(
    client: httpx.AsyncClient, url: str, policy: MediaPolicy, resolver: Resolver, max_bytes: int
) -> bytes:
    for _hop in range(policy.max_redirects + 1):
        _scheme, host, port = _target(url, policy)
        address = await checked_address(host, port, policy, resolver)
        pinned, headers, extensions = _pinned(url, address)
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                url = urljoin(url, response.headers["location"])
                continue
            if response.status_code != 200:
                raise MediaError(
                    f"media URL answered HTTP {response.status_code}", "media_fetch_failed"
                )
            body = bytearray()
            # Raw bytes: a compressed body is not expanded, so its size is what arrives.
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > max_bytes:
                    break
            return bytes(body)
        finally:
            await response.aclose()
    raise MediaError(
        f"media URL redirected more than {policy.max_redirects} times (--media-max-redirects)",
        "media_fetch_failed",
    )


async def fetch(
    url: str, policy: MediaPolicy, max_bytes: int, resolver: Resolver = resolve
) -> bytes:
    """The body at `url`, at most `max_bytes` + 1 bytes of it (more means too large)."""
    if not policy.allow_remote:
        raise MediaError(
            "remote media URLs are not fetched; send the image as a data: URI or start the "
            "server with --allow-remote-media",
            "media_not_allowed",
        )
    timeout = httpx.Timeout(policy.fetch_timeout)
    # trust_env off: no proxy from the environment may connect anywhere else.
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        try:
            return await asyncio.wait_for(
                _get(client, url, policy, resolver, max_bytes), policy.fetch_timeout
            )
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            raise MediaError(
                f"fetching the media URL took longer than {policy.fetch_timeout:g}s "
                "(--media-fetch-timeout)",
                "media_fetch_timeout",
            ) from exc
        except httpx.HTTPError as exc:
            raise MediaError(f"could not fetch the media URL: {exc}", "media_fetch_failed") from exc
