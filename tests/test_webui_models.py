"""The playground's Models panel in headless Chromium, on a real server pulling from a stand-in
for the Hugging Face Hub on loopback (tests/fake_hub.py): a pull's live progress, its cancel and
its end, the pulled model on disk, loaded under a name, unloaded and removed; and a server
without --allow-downloads, whose refusal the panel shows. GET /models/local is checked over
HTTP beside it (paths only with an API key)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests._client_util import default_gguf
from tests.conftest import start
from tests.fake_hub import FakeHub, fake_hub
from tests.test_webui import KEY, TIMEOUT_MS, Playground, chromium  # noqa: F401

pytestmark = pytest.mark.slow

REPO = "org/served-GGUF"
FILE = "served-Q4_1.gguf"
ON_DISK = f"{REPO}:{FILE}"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with fake_hub(FakeHub({REPO: {FILE: default_gguf().read_bytes()}})) as served:
        yield served


def _models_tab(view: Playground) -> Page:
    page = view.open()
    page.click("#tabs [data-view=models]")
    page.locator("#served-models tr").first.wait_for()
    return page


def _row(page: Page, table: str, name: str) -> str:
    return f"#{table} tr[data-model='{name}']"


def test_pull_load_unload_and_remove_in_the_models_panel(
    chromium: Browser,  # noqa: F811
    hub: FakeHub,
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)}
    server = start(tmp_path, "--allow-downloads", "--api-key", KEY, "--ctx-size", "512", env=env)
    view = Playground(chromium, server, viewport={"width": 1200, "height": 900})
    view.context.add_init_script(f"sessionStorage.setItem('mlxcel.apiKey', {KEY!r})")
    view.page.on("dialog", lambda dialog: dialog.accept())
    try:
        page = _models_tab(view)
        expect(page.locator("#served-models td").first).not_to_have_text("")
        expect(page.locator("#downloads-note")).to_be_hidden()
        assert page.locator(_row(page, "local-models", ON_DISK)).count() == 0

        # A repo the Hub does not have: the 400's message, in the panel.
        page.fill("#panel-models [name=model]", "org/nothing")
        page.click("#panel-models button[type=submit]")
        expect(page.locator("#panel-models .error")).to_contain_text("org/nothing")

        # The file stalls after 12 MiB: the bar shows the bytes so far, then Cancel stops it.
        hub.stall_once.add(FILE)
        page.fill("#panel-models [name=model]", f"{REPO}:Q4_1")
        page.click("#panel-models button[type=submit]")
        form = page.locator(".pull-form")
        expect(form).to_have_attribute("data-status", "progress", timeout=TIMEOUT_MS)
        expect(page.locator(".pull-progress")).to_contain_text("%")
        expect(page.locator(".pull-progress")).to_contain_text("MiB of 93.8 MiB")
        value = float(page.locator(".pull-form progress").get_attribute("value") or 0)
        assert 0 < value < 1
        page.click(".pull-form button:text('Cancel')")
        hub.release.set()
        expect(form).to_have_attribute("data-status", "cancelled", timeout=TIMEOUT_MS)
        expect(page.locator(".pull-progress")).to_contain_text("Cancelled")

        # Pulled again it resumes, ends done and is listed on disk.
        page.click("#panel-models button[type=submit]")
        expect(form).to_have_attribute("data-status", "done", timeout=TIMEOUT_MS)
        expect(page.locator(".pull-progress")).to_have_text("Done: 93.8 MiB")
        assert hub.ranges[-1][1] is not None, "the second pull did not resume"
        local = page.locator(_row(page, "local-models", ON_DISK))
        expect(local).to_contain_text("Q4_1")
        expect(local).to_contain_text("gguf")

        # Loaded under a name: served and loaded, with its memory; then unloaded.
        local.locator("input").fill("pulled")
        local.locator("button:text('Load')").click()
        served = page.locator(_row(page, "served-models", "pulled"))
        expect(served.locator(".state")).to_have_text("loaded", timeout=TIMEOUT_MS)
        expect(served.locator(".num")).to_contain_text("MiB")
        expect(page.locator("#model option[value=pulled]")).to_have_count(1)
        # Removing a model a process holds is refused, and the panel says why.
        local.locator("button:text('Remove')").click()
        expect(page.locator("#panel-models .error")).to_contain_text("in use by process")
        served.locator("button:text('Unload')").click()
        expect(served.locator(".state")).to_have_text("unloaded", timeout=TIMEOUT_MS)
        local.locator("button:text('Remove')").click()
        expect(local).to_have_count(0)
        expect(page.locator("#panel-models .error")).to_be_hidden()
        assert not list(cache.rglob(FILE))
        view.shot(tmp_path / "models.png")

        with server.http(headers={"Authorization": f"Bearer {KEY}"}) as http:
            listed = http.get("/models/local").json()
        assert listed["downloads"] is True
        assert all(Path(m["path"]).exists() for m in listed["data"])
        # Only the refused pull and Remove logged an error.
        assert all("400" in e or "409" in e for e in view.errors), view.errors
    finally:
        view.close()
        server.stop()


def test_a_server_without_downloads_says_so_in_the_panel(
    chromium: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "cache")}
    server = start(tmp_path, "--ctx-size", "512", env=env)
    try:
        view = Playground(chromium, server, viewport={"width": 1200, "height": 900})
        try:
            page = _models_tab(view)
            expect(page.locator("#downloads-note")).to_be_visible()
            expect(page.locator("#local-models tr[data-model=default]")).to_have_count(1)
            page.fill("#panel-models [name=model]", f"{REPO}:Q4_1")
            page.click("#panel-models button[type=submit]")
            error = page.locator("#panel-models .error")
            expect(error).to_contain_text("downloads are off on this server")
            expect(page.locator(".pull-form progress")).to_be_hidden()
            assert all("403" in e for e in view.errors), view.errors
        finally:
            view.close()
        with server.http() as http:
            listed = http.get("/models/local").json()
        assert listed["downloads"] is False
        # No API key: no paths (docs/security.md).
        assert listed["data"] and all("path" not in m for m in listed["data"])

        # On a phone, in dark mode, nothing is wider than the screen.
        size = {"width": 390, "height": 800}
        phone = Playground(chromium, server, viewport=size, color_scheme="dark")
        try:
            page = _models_tab(phone)
            expect(page.locator("#local-models tr[data-model=default]")).to_have_count(1)
            phone.shot(tmp_path / "phone.png")
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            assert phone.errors == []
        finally:
            phone.close()
    finally:
        server.stop()
