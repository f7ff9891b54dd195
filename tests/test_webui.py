"""The browser playground at /: served files, and the page in headless Chromium on a real server.

Chromium is Debian's (`make test` installs it); Playwright drives it. Replies are never asserted
by their words: the tests check that streamed text appears, what the page sends, and output a
grammar, schema or forced tool call fixes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import serving, start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHAT = "/v1/chat/completions"
KEY = "playground-key"
# Generation on a loaded CI machine may take a while; no assertion is about time.
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def webui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model; the qwen3 reasoning parser splits <think> text a grammar forces."""
    yield from serving(
        tmp_path_factory, "webui", "--ctx-size", "2048", "--reasoning-parser", "qwen3"
    )


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


class Playground:
    """One browser context (fresh storage) on the page, collecting what the console reports."""

    def __init__(self, browser: Browser, server: ServerProcess, **context: Any) -> None:
        self.server = server
        self.context = browser.new_context(**context)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def open(self) -> Page:
        self.page.goto(self.server.root + "/")
        self.page.wait_for_selector("body[data-ready=true]")
        return self.page

    def send(self, text: str) -> dict[str, Any]:
        """Type a message, press Enter, and return the chat request the page made."""
        self.page.fill("#prompt", text)
        return self.sent(lambda: self.page.press("#prompt", "Enter"))

    def sent(self, action: Any) -> dict[str, Any]:
        """The body of the chat request `action` makes."""
        with self.page.expect_request(lambda r: r.url.endswith(CHAT)) as request:
            action()
        body: dict[str, Any] = request.value.post_data_json
        return body

    def wait_reply(self) -> Any:
        """Wait until no reply streams; the last assistant message."""
        # Locators, not wait_for_function: the page's policy forbids evaluating strings.
        self.page.locator(".msg.streaming").wait_for(state="detached")
        self.page.locator("#send").wait_for()
        return self.page.locator(".msg.assistant").last

    def settings(self, **fields: str) -> None:
        """Open the settings panel and fill its fields by name."""
        if self.page.locator("#settings").is_hidden():
            self.page.click("#toggle-settings")
        for name, value in fields.items():
            field = self.page.locator(f"#settings-form [name={name}]")
            if name == "format":
                field.select_option(value)
            else:
                field.fill(value)

    def shot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def playground(chromium: Browser, webui: ServerProcess, tmp_path: Path) -> Iterator[Playground]:
    view = Playground(chromium, webui, viewport={"width": 1200, "height": 800})
    yield view
    view.shot(tmp_path / "end.png")
    view.close()
    assert view.errors == []


def test_page_and_files_are_served_under_a_same_origin_policy(webui: ServerProcess) -> None:
    with webui.http() as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "connect-src 'self'" in policy
        assert "script-src 'self'" in policy
        linked = re.findall(r'(?:src|href)="(/webui/[^"]+)"', page.text)
        assert "/webui/app.js" in linked
        for path in linked:
            assert http.get(path).status_code == 200, path
        again = http.get("/", headers={"If-None-Match": page.headers["etag"]})
        assert again.status_code == 304
        missing = http.get("/webui/nothing.js")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"


def test_no_webui_answers_404_in_the_envelope(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start(tmp_path_factory.mktemp("no-webui"), "--no-webui", "--ctx-size", "512")
    try:
        with server.http() as http:
            for path in ("/", "/webui/app.js"):
                response = http.get(path)
                assert response.status_code == 404
                assert response.json()["error"]["code"] == "not_found"
            assert http.get("/v1/models").status_code == 200
    finally:
        server.stop()


def test_chat_streams_is_kept_and_can_be_edited(playground: Playground, tmp_path: Path) -> None:
    page = playground.open()
    model = playground.server.openai().models.list().data[0].id
    assert page.input_value("#model") == model
    playground.settings(max_tokens="12")
    body = playground.send("Tell me about the sea.")
    assert body["model"] == model
    assert body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "Tell me about the sea."}]
    reply = playground.wait_reply()
    assert reply.locator(".msg-body").inner_text().strip()
    stats = reply.locator(".stats").inner_text()
    assert re.search(r"\d+ tokens", stats)
    assert "tok/s" in stats and "first token" in stats and "prompt " in stats
    playground.shot(tmp_path / "chat.png")

    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.locator(".conversations .current").inner_text() == "Tell me about the sea."
    assert page.locator(".msg.user .msg-body").inner_text() == "Tell me about the sea."
    assert page.input_value("[name=max_tokens]") == "12"

    # Regenerate sends the same history again; edit-and-resend cuts it at the edited message.
    body = playground.sent(lambda: page.click(".msg.assistant >> text=Regenerate"))
    assert body["messages"] == [{"role": "user", "content": "Tell me about the sea."}]
    playground.wait_reply()
    assert page.locator(".msg").count() == 2
    page.click(".msg.user >> text=Edit")
    page.fill(".edit-area", "Tell me about rivers.")
    body = playground.sent(lambda: page.press(".edit-area", "Enter"))
    assert body["messages"] == [{"role": "user", "content": "Tell me about rivers."}]
    playground.wait_reply()
    assert page.locator(".msg.user .msg-body").inner_text() == "Tell me about rivers."

    # Shift+Enter is a new line, not a send.
    page.fill("#prompt", "one")
    page.press("#prompt", "Shift+Enter")
    page.type("#prompt", "two")
    assert page.input_value("#prompt") == "one\ntwo"
    assert page.locator(".msg").count() == 2


def test_settings_reach_the_request_and_stay_with_their_conversation(
    playground: Playground,
) -> None:
    page = playground.open()
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
    }
    playground.settings(
        system="You count things.",
        temperature="0.3",
        top_p="0.9",
        top_k="20",
        min_p="0.1",
        max_tokens="40",
        seed="7",
        format="json_schema",
        schema=json.dumps(schema),
    )
    body = playground.send("How many legs has a cat?")
    assert body["messages"][0] == {"role": "system", "content": "You count things."}
    fields = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")
    assert {k: body[k] for k in fields} == {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
        "max_tokens": 40,
        "seed": 7,
    }
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == schema
    reply = playground.wait_reply()
    # The schema holds the output, whatever the model would have said.
    assert isinstance(json.loads(reply.locator(".msg-body").inner_text())["count"], int)

    page.click("#new-chat")
    playground.settings(temperature="1.5")
    page.click(".conversations li:nth-child(2) .open")
    assert page.input_value("[name=temperature]") == "0.3"
    page.click(".conversations li:nth-child(1) .open")
    assert page.input_value("[name=temperature]") == "1.5"

    playground.settings(extra="[1]")
    page.fill("#prompt", "hi")
    page.press("#prompt", "Enter")
    assert "must be a JSON object" in page.inner_text("#settings-error")
    assert page.locator(".msg").count() == 0


def test_conversations_are_renamed_exported_and_deleted(playground: Playground) -> None:
    page = playground.open()
    playground.settings(max_tokens="4")
    playground.send("First question")
    playground.wait_reply()
    page.click("#new-chat")
    playground.send("Second question")
    playground.wait_reply()
    titles = page.locator(".conversations .open")
    assert titles.all_inner_texts() == ["Second question", "First question"]

    # Another conversation's actions show on hover or keyboard focus.
    page.locator(".conversations li").nth(1).hover()
    page.click("[aria-label='Rename First question']")
    page.fill(".rename", "Renamed")
    page.press(".rename", "Enter")
    assert titles.all_inner_texts() == ["Second question", "Renamed"]

    with page.expect_download() as download:
        page.click("[aria-label='Export Renamed']")
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["title"] == "Renamed"
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["messages"][0]["content"] == "First question"
    assert exported["settings"]["max_tokens"] == "4"

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(".conversations li").nth(1).locator(".open").focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Delete Renamed"
    page.keyboard.press("Enter")
    assert titles.all_inner_texts() == ["Second question"]
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert titles.all_inner_texts() == ["Second question"]


def test_stop_cancels_the_request_on_the_server(playground: Playground, tmp_path: Path) -> None:
    page = playground.open()
    server = playground.server
    playground.settings(max_tokens="1500", extra='{"ignore_eos": true}')
    tokens, cancelled = server.generation_counts()
    body = playground.send("Count slowly.")
    assert body["ignore_eos"] is True
    page.locator(".msg.streaming .msg-body").filter(has_text=re.compile(r"\S")).wait_for()
    playground.shot(tmp_path / "streaming.png")
    page.keyboard.press("Escape")
    reply = playground.wait_reply()
    assert reply.locator(".stats").inner_text().startswith("stopped")
    server.assert_cancelled_early(tokens, cancelled, max_tokens=1500)
    with server.http() as http:
        assert not any(slot["is_processing"] for slot in http.get("/slots").json())


def test_reasoning_and_tool_calls_are_shown_apart(playground: Playground) -> None:
    playground.open()
    grammar = 'root ::= "<think>" "Let me see." "</think>" "Fine."'
    playground.settings(extra=json.dumps({"grammar": grammar}))
    playground.send("How are you?")
    reply = playground.wait_reply()
    assert reply.locator(".reasoning summary").inner_text() == "Reasoning"
    # Collapsed once the answer came; a click opens it.
    expect(reply.locator(".reasoning-text")).to_be_hidden()
    reply.locator(".reasoning summary").click()
    assert reply.locator(".reasoning-text").inner_text() == "Let me see."
    assert reply.locator(".msg-body").inner_text() == "Fine."

    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
            },
        },
    }
    # One short call: the grammar then ends the answer, however slow the machine.
    extra = {"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False}
    playground.settings(extra=json.dumps(extra))
    playground.send("Weather in Paris?")
    reply = playground.wait_reply()
    # The grammar forces one call to get_weather; it is drawn as a call.
    names = reply.locator(".tool-call-head code").all_inner_texts()
    assert names == ["get_weather"]
    for arguments in reply.locator(".tool-call pre").all_inner_texts():
        assert isinstance(json.loads(arguments)["city"], str)


def test_phone_width_and_dark_mode(chromium: Browser, webui: ServerProcess, tmp_path: Path) -> None:
    view = Playground(chromium, webui, viewport={"width": 390, "height": 760}, color_scheme="dark")
    try:
        page = view.open()
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(map(int, re.findall(r"\d+", background))) < 3 * 64, background
        expect(page.locator("#sidebar")).not_to_be_in_viewport()
        view.shot(tmp_path / "phone.png")
        page.click("#toggle-sidebar")
        expect(page.locator("#sidebar")).to_be_in_viewport(ratio=1)
        view.shot(tmp_path / "phone-sidebar.png")
        assert view.errors == []
    finally:
        view.close()


def test_a_keyed_server_asks_for_the_key(
    chromium: Browser, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    server = start(tmp_path_factory.mktemp("webui-keyed"), "--api-key", KEY, "--ctx-size", "512")
    view = Playground(chromium, server, viewport={"width": 1000, "height": 700})
    try:
        page = view.page
        page.goto(server.root + "/")
        page.wait_for_selector("#key-dialog[open]")
        assert "needs an API key" in page.inner_text("#key-message")
        page.fill("#key-input", "wrong")
        page.press("#key-input", "Enter")
        page.locator("#key-message", has_text="refused").wait_for()
        view.shot(tmp_path / "key-refused.png")
        page.fill("#key-input", KEY)
        page.press("#key-input", "Enter")
        page.wait_for_selector("body[data-ready=true]")
        assert page.evaluate("sessionStorage.getItem('mlxcel.apiKey')") == KEY
        assert page.evaluate(f"JSON.stringify(localStorage).includes({KEY!r})") is False
        view.settings(max_tokens="8")
        page.fill("#prompt", "hi")
        with page.expect_request(lambda r: r.url.endswith(CHAT)) as request:
            page.press("#prompt", "Enter")
        assert request.value.headers["authorization"] == f"Bearer {KEY}"
        assert view.wait_reply().locator(".error").count() == 0
        # Only the two refused /v1/models requests may have logged an error.
        assert all("401" in error for error in view.errors), view.errors
    finally:
        view.close()
        server.stop()


def test_page_logic(playground: Playground) -> None:
    """The page's own functions, run in the browser on the served modules."""
    page = playground.open()
    results = page.evaluate(Path(__file__).with_name("webui_logic.js").read_text())
    failures = {name: result for name, result in results.items() if result is not True}
    assert failures == {}
    assert len(results) >= 10
