"""`mlxcel serve`'s media flags: where request images may come from, and their limits."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.media.policy import MediaLimits, MediaPolicy, parse_hosts

_LIMITS = MediaLimits()
_POLICY = MediaPolicy()


def media_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --mmproj and the media policy and limit flags."""
    add = parser.add_argument
    add(
        "--mmproj",
        type=Path,
        metavar="FILE",
        help="a vision projector GGUF for the -m GGUF model: chat requests may then hold images",
    )
    add(
        "--allow-remote-media",
        action="store_true",
        help="fetch http(s) image URLs (off: only data: URIs); private, loopback, link-local "
        "and metadata addresses stay refused unless their host is in --media-allow-hosts",
    )
    add(
        "--allow-insecure-media",
        action="store_true",
        help="with --allow-remote-media, also fetch plain http:// URLs (default: HTTPS only)",
    )
    add(
        "--media-allow-hosts",
        type=parse_hosts,
        default=_POLICY.allow_hosts,
        metavar="HOST,...",
        help="hosts fetched from whatever address they resolve to (a LAN or loopback server)",
    )
    add(
        "--allowed-local-media",
        type=Path,
        metavar="DIR",
        help="read file:// image URLs from inside DIR (symlinks resolved; default: none)",
    )
    add(
        "--media-fetch-timeout",
        type=float,
        default=_POLICY.fetch_timeout,
        metavar="SECONDS",
        help="time one image URL may take, redirects and body included (default: %(default)g)",
    )
    add(
        "--media-max-redirects",
        type=int,
        default=_POLICY.max_redirects,
        metavar="N",
        help="redirect hops followed, each checked like the URL; 0 follows none "
        "(default: %(default)d)",
    )
    for flag, field, what in (
        ("--media-max-images", "max_images", "images in one request"),
        ("--media-max-image-bytes", "max_image_bytes", "encoded bytes of one image"),
        ("--media-max-pixels", "max_pixels", "width x height of one image"),
        (
            "--media-max-bytes",
            "max_total_bytes",
            "encoded bytes of a request's images together (and of its audio clips)",
        ),
    ):
        add(
            flag,
            type=int,
            dest=field,
            default=getattr(_LIMITS, field),
            metavar="N",
            help=f"most {what} (default: %(default)d)",
        )


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """The media policy the flags ask for."""
    limits = MediaLimits(
        max_images=args.max_images,
        max_image_bytes=args.max_image_bytes,
        max_pixels=args.max_pixels,
        max_total_bytes=args.max_total_bytes,
        max_audio_seconds=args.max_audio_seconds,
    )
    return MediaPolicy(
        limits=limits,
        allow_remote=args.allow_remote_media,
        allow_insecure=args.allow_insecure_media,
        allow_hosts=args.media_allow_hosts,
        local_dir=args.allowed_local_media,
        fetch_timeout=args.media_fetch_timeout,
        max_redirects=args.media_max_redirects,
    )
