"""The media module on its own: data URIs, limits, the remote and local media policies.

Every HTTP server here listens on 127.0.0.1; other addresses are refused before any connection,
and names resolve through a resolver patched in-process.
"""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from mlxcel.media.addresses import IPAddress, Resolver, refusal
from mlxcel.media.images import EncodedImage, Image, checked, image_type
from mlxcel.media.loader import ImageRef, load_images
from mlxcel.media.policy import MediaError, MediaLimits, MediaPolicy, parse_hosts
from tests.media_util import MIME, bomb_png, data_uri, http_server, image_bytes

PNG = image_bytes()
REMOTE = MediaPolicy(allow_remote=True, allow_insecure=True)
DEFAULT = MediaPolicy()
LOOPBACK = MediaPolicy(allow_remote=True, allow_insecure=True, allow_hosts=parse_hosts("127.0.0.1"))


def sent(
    urls: list[str], policy: MediaPolicy = DEFAULT, resolver: Resolver | None = None
) -> list[EncodedImage]:
    """The images as the HTTP process reads them: their headers checked."""
    refs = [ImageRef(url, f"image{i}") for i, url in enumerate(urls)]
    if resolver is None:
        return asyncio.run(load_images(refs, policy))
    return asyncio.run(load_images(refs, policy, resolver))


def load(
    urls: list[str], policy: MediaPolicy = DEFAULT, resolver: Resolver | None = None
) -> list[Image]:
    """The images as the model's worker reads them: decoded."""
    return [image.decoded() for image in sent(urls, policy, resolver)]


def refused(
    urls: list[str], policy: MediaPolicy = DEFAULT, resolver: Resolver | None = None
) -> MediaError:
    with pytest.raises(MediaError) as caught:
        load(urls, policy, resolver)
    return caught.value


def names(table: dict[str, list[str]]) -> Resolver:
    async def resolver(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in table[host]]

    return resolver


@pytest.mark.parametrize("fmt", list(MIME))
def test_data_uri_of_every_format_decodes(fmt: str) -> None:
    (image,) = load([data_uri(image_bytes(fmt, (12, 8)), MIME[fmt])])
    assert (image.width, image.height, len(image.rgb)) == (12, 8, 12 * 8 * 3)


@pytest.mark.parametrize("fmt", list(MIME))
def test_an_image_is_told_by_its_first_bytes(fmt: str) -> None:
    assert image_type(image_bytes(fmt)[:12]) == MIME[fmt]


def test_other_files_are_no_image() -> None:
    # A WAV file is RIFF as WebP is; then its own type follows.
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    for head in (wav, b"ID3\x04", b"fLaC", b"OggS", b"%PDF-1.7", b"BM", b""):
        assert image_type(head) is None


def test_base64_wrapped_in_lines_decodes_as_the_same_image() -> None:
    payload = data_uri(PNG).split(",", 1)[1]
    wrapped = "\r\n".join(payload[i : i + 76] for i in range(0, len(payload), 76))
    (image,) = load([f"data:image/png;base64,{wrapped}"])
    assert image.digest == load([data_uri(PNG)])[0].digest


def test_same_pixels_same_digest_other_pixels_other_digest() -> None:
    a, b, c = load(
        [
            data_uri(PNG),
            data_uri(image_bytes("WEBP", color=0), "image/webp"),
            data_uri(image_bytes(color=99)),
        ]
    )
    assert a.digest != c.digest
    assert len({a.digest, b.digest, c.digest}) >= 2


@pytest.mark.parametrize(
    ("url", "code", "message"),
    [
        ("data:image/bmp;base64,AAAA", "invalid_image", "image type 'image/bmp' is not supported"),
        ("data:image/png;base64,@@@", "invalid_image", "image data is not valid base64"),
        ("data:image/png;base64,iVBORw0", "invalid_image", "image data is not valid base64"),
        ("data:image/png;base64,iVBORéw0", "invalid_image", "image data is not valid base64"),
        ("data:image/png,abc", "invalid_image_url", "data: URIs must be base64 encoded"),
        (data_uri(b"not an image"), "invalid_image", "could not decode the image"),
        ("ftp://example.com/a.png", "invalid_image_url", "image_url must be a data: URI"),
    ],
)
def test_bad_data_is_refused(url: str, code: str, message: str) -> None:
    error = refused([url])
    assert (error.code, error.param) == (code, "image0")
    assert error.message.startswith(message)


def test_limits_each_refuse_with_their_flag() -> None:
    small = MediaPolicy(
        limits=MediaLimits(max_images=2, max_image_bytes=len(PNG), max_total_bytes=2 * len(PNG) - 1)
    )
    error = refused([data_uri(PNG)] * 3, small)
    assert error.code == "too_many_images"
    assert (
        error.message == "the request has 3 images, more than the limit of 2 (--media-max-images)"
    )
    error = refused([data_uri(PNG), data_uri(PNG)], small)
    assert (error.code, error.param) == ("media_too_large", "image1")
    assert "(--media-max-bytes)" in error.message
    larger = data_uri(image_bytes(size=(32, 32)))
    error = refused([larger], small)
    assert error.code == "image_too_large"
    assert error.message == (
        f"an image is larger than the limit of {len(PNG)} bytes (--media-max-image-bytes)"
    )
    # Decoded once under a larger limit, the same URI is still too large under this one.
    load([larger])
    assert refused([larger], small).code == "image_too_large"


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    bomb = bomb_png()
    assert len(bomb) < 1024 * 1024
    error = refused([data_uri(bomb)])
    assert error.code == "image_too_many_pixels"
    assert error.message == (
        f"image is 8000x8000 = 64000000 pixels, more than the limit of "
        f"{MediaLimits().max_pixels} (--media-max-pixels)"
    )


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("192.168.0.1", "a private address"),
        ("fd12::1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("100.100.100.200", "a cloud metadata address"),
        ("fe80::1", "a link-local address"),
        ("224.0.0.1", "a multicast address"),
        ("0.0.0.0", "an unspecified address"),
        ("100.64.0.1", "a reserved address"),
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
    ],
)
def test_address_refusals(address: str, why: str | None) -> None:
    assert refusal(ipaddress.ip_address(address)) == why


def test_remote_urls_are_off_by_default() -> None:
    with http_server({"/a.png": (200, {}, PNG, 0)}) as (base, seen):
        error = refused([f"{base}/a.png"])
    assert (error.code, seen) == ("media_not_allowed", [])
    assert "--allow-remote-media" in error.message


def test_https_only_unless_insecure_is_allowed() -> None:
    error = refused(["http://127.0.0.1:1/a.png"], MediaPolicy(allow_remote=True))
    assert error.code == "media_not_allowed"
    assert "--allow-insecure-media" in error.message


def test_remote_alone_refuses_loopback() -> None:
    with http_server({"/a.png": (200, {}, PNG, 0)}) as (base, seen):
        error = refused([f"{base}/a.png"], REMOTE)
    assert seen == []
    assert error.message == (
        "media URL host '127.0.0.1' resolves to 127.0.0.1, a loopback address; "
        "list the host in --media-allow-hosts to fetch from it"
    )


def test_a_listed_host_is_fetched() -> None:
    with http_server({"/a.png": (200, {"Content-Type": "image/png"}, PNG, 0)}) as (base, seen):
        (image,) = load([f"{base}/a.png"], LOOPBACK)
    assert image.digest == load([data_uri(PNG)])[0].digest
    assert seen == [("/a.png", base.removeprefix("http://"))]


def test_the_connection_goes_to_the_checked_address() -> None:
    """A name is resolved once, and the request goes to that address with the name as Host."""
    with http_server({"/a.png": (200, {}, PNG, 0)}) as (base, seen):
        port = base.rsplit(":", 1)[1]
        policy = MediaPolicy(
            allow_remote=True, allow_insecure=True, allow_hosts=parse_hosts("images.test")
        )
        load([f"http://images.test:{port}/a.png"], policy, names({"images.test": ["127.0.0.1"]}))
    assert seen == [("/a.png", f"images.test:{port}")]


def test_every_answer_is_checked() -> None:
    resolver = names({"mixed.test": ["93.184.216.34", "10.0.0.7"]})
    error = refused(["http://mixed.test/a.png"], REMOTE, resolver)
    assert error.message.startswith("media URL host 'mixed.test' resolves to 10.0.0.7, a private")


@pytest.mark.parametrize(
    "target",
    ["http://127.0.0.2:9/x.png", "http://169.254.169.254/latest", "http://localhost:9/x.png"],
)
def test_a_redirect_to_an_unlisted_private_address_is_refused(target: str) -> None:
    routes = {"/a.png": (302, {"Location": target}, b"", 0.0)}
    with http_server(routes) as (base, seen):
        error = refused([f"{base}/a.png"], LOOPBACK)
    assert error.code == "media_not_allowed"
    assert "resolves to" in error.message and "--media-allow-hosts" in error.message
    assert [path for path, _ in seen] == ["/a.png"]


def test_redirects_are_followed_checked_and_bounded() -> None:
    routes = {
        "/1": (301, {"Location": "/2"}, b"", 0.0),
        "/2": (307, {"Location": "/img"}, b"", 0.0),
        "/img": (200, {}, PNG, 0.0),
    }
    with http_server(routes) as (base, seen):
        assert len(load([f"{base}/1"], LOOPBACK)) == 1
        no_redirects = MediaPolicy(
            allow_remote=True,
            allow_insecure=True,
            max_redirects=0,
            allow_hosts=LOOPBACK.allow_hosts,
        )
        error = refused([f"{base}/1"], no_redirects)
    assert error.message == "media URL redirected more than 0 times (--media-max-redirects)"
    assert [path for path, _ in seen] == ["/1", "/2", "/img", "/1"]


def test_fetched_bodies_are_limited_while_streaming() -> None:
    big = image_bytes(size=(64, 64))
    policy = MediaPolicy(
        allow_remote=True,
        allow_insecure=True,
        allow_hosts=LOOPBACK.allow_hosts,
        limits=MediaLimits(max_image_bytes=len(big) - 1),
    )
    with http_server(
        {
            "/big.png": (200, {}, big, 0.0),
            "/bomb.png": (200, {}, bomb_png(), 0.0),
            "/gone": (404, {}, b"", 0.0),
        }
    ) as (base, _seen):
        assert refused([f"{base}/big.png"], policy).code == "image_too_large"
        assert refused([f"{base}/bomb.png"], LOOPBACK).code == "image_too_many_pixels"
        error = refused([f"{base}/gone"], LOOPBACK)
    assert (error.code, error.message) == ("media_fetch_failed", "media URL answered HTTP 404")


def test_a_slow_body_hits_the_time_limit() -> None:
    policy = MediaPolicy(
        allow_remote=True, allow_insecure=True, fetch_timeout=0.5, allow_hosts=LOOPBACK.allow_hosts
    )
    with http_server({"/slow.png": (200, {}, PNG, 3.0)}) as (base, _seen):
        error = refused([f"{base}/slow.png"], policy)
    assert error.code == "media_fetch_timeout"
    assert error.message == "fetching the media URL took longer than 0.5s (--media-fetch-timeout)"


def test_local_files_only_inside_the_allowed_directory(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "in.png").write_bytes(PNG)
    (outside / "out.png").write_bytes(PNG)
    (allowed / "link.png").symlink_to(outside / "out.png")
    (allowed / "inner.png").symlink_to(allowed / "in.png")
    policy = MediaPolicy(local_dir=allowed)
    assert len(load([f"file://{allowed}/in.png", f"file://{allowed}/inner.png"], policy)) == 2
    assert "--allowed-local-media DIR" in refused([f"file://{allowed}/in.png"]).message
    for url in (
        f"file://{outside}/out.png",
        f"file://{allowed}/link.png",
        f"file://{allowed}/../outside/out.png",
    ):
        error = refused([url], policy)
        assert error.message == (
            "local media path is outside the directory --allowed-local-media allows"
        ), url


def test_an_image_sent_again_is_decoded_once_under_its_pixel_limit() -> None:
    """The worker keeps a decoded image by its file's bytes and the pixel limit it was read
    under: the same file again (another bytes object) is not decoded again."""
    data = image_bytes(size=(20, 10), color=7)
    first = checked(data, 1000).decoded()
    assert checked(bytes(bytearray(data)), 1000).decoded() is first
    assert checked(data, 2000).decoded() is not first
    with pytest.raises(MediaError) as caught:
        EncodedImage(data, 20, 10, 100).decoded()
    assert caught.value.code == "image_too_many_pixels"


def test_a_data_uri_sent_again_is_not_read_again() -> None:
    """A data: URI is kept by its text: sent again, its base64 is not decoded again, and the
    image is named by the field it comes in this time."""
    uri = data_uri(image_bytes(size=(20, 10), color=9))
    (first,) = sent([uri])
    again = sent([uri, data_uri(PNG)])[0]
    assert again.data is first.data
    assert (first.param, again.param) == ("image0", "image0")
    (moved,) = sent([data_uri(PNG), uri])[1:]
    assert moved.data is first.data and moved.param == "image1"


def test_the_header_is_checked_where_the_request_is_read_and_the_pixels_where_they_are_used() -> (
    None
):
    """A header over the pixel limit is refused by the HTTP process; a file whose header reads
    but whose pixels do not decode is refused by the worker, naming its field."""
    data = image_bytes(size=(20, 10), color=3)
    with pytest.raises(MediaError) as caught:
        checked(data, 100, "messages.0.content.0")
    assert (caught.value.code, caught.value.param) == (
        "image_too_many_pixels",
        "messages.0.content.0",
    )
    truncated = checked(data[: len(data) // 2], 1000, "messages.0.content.1")
    assert (truncated.width, truncated.height) == (20, 10)
    with pytest.raises(MediaError) as caught:
        truncated.decoded()
    assert (caught.value.code, caught.value.param) == ("invalid_image", "messages.0.content.1")
