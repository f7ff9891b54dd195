"""The playground's Live panel in headless Chromium: the microphone is a fake capture device
playing a spoken clip in a loop (Chromium's --use-file-for-fake-audio-capture), streamed to
/v1/realtime: transcribed live, and answered by the chat model in Talk mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, expect, sync_playwright

from tests.audio_util import word_error_rate
from tests.conftest import serving
from tests.realtime_util import spoken_pcm, wav_bytes
from tests.server_process import ServerProcess
from tests.test_webui import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

pytestmark = pytest.mark.slow

SENTENCE = "We will meet at the station at noon tomorrow."


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Whisper, the voice and the chat model (short answers: -n 24)."""
    yield from serving(
        tmp_path_factory,
        "realtime-webui",
        "--transcription-model",
        "default",
        "--speech-model",
        "default",
        "-n",
        "24",
    )


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wav file the fake microphone plays."""
    folder = tmp_path_factory.mktemp("microphone")
    path = folder / "microphone.wav"
    path.write_bytes(wav_bytes(spoken_pcm(SENTENCE, folder, 48_000, (0.5, 1.5)), 48_000))
    return path


@pytest.fixture(scope="module")
def chromium(capture: Path) -> Iterator[Browser]:
    args = [
        *CHROMIUM_ARGS,
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={capture}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield browser
        browser.close()


def live_panel(chromium: Browser, server: ServerProcess, errors: list[str]) -> Locator:
    """The Live tab of a fresh page, its console errors collected in `errors`."""
    page = chromium.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server.root + "/")
    page.wait_for_selector("body[data-ready=true]")
    page.click("button.tab[data-view=live]")
    return page.locator("#panel-live")


def test_the_microphone_transcribes_live(
    live_server: ServerProcess, chromium: Browser, capture: Path
) -> None:
    client = live_server.openai()
    audio = ("clip.wav", capture.read_bytes())
    heard = client.audio.transcriptions.create(model="whisper-1", file=audio).text
    errors: list[str] = []
    panel = live_panel(chromium, live_server, errors)
    run = panel.locator("button[type=submit]")
    expect(run).to_have_text("Start")
    run.click()
    expect(run).to_have_text("Stop")
    final = panel.locator(".live-turn.final").first
    expect(final).not_to_have_text("")
    said = final.text_content() or ""
    run.click()
    expect(run).to_have_text("Start")
    assert panel.locator(".tool-output .error").count() == 0, panel.inner_text()
    assert errors == []
    # The fake device loops the file: a turn may start inside the clip, so allow more misses.
    assert word_error_rate(heard, said) <= 0.5, (heard, said)


def test_talk_answers_the_microphone(live_server: ServerProcess, chromium: Browser) -> None:
    errors: list[str] = []
    panel = live_panel(chromium, live_server, errors)
    panel.locator("select[name=mode]").select_option("talk")
    run = panel.locator("button[type=submit]")
    run.click()
    expect(panel.locator(".live-turn.final").first).not_to_have_text("")
    expect(panel.locator(".live-reply").first).not_to_have_text("")
    run.click()
    expect(run).to_have_text("Start")
    assert panel.locator(".tool-output .error").count() == 0, panel.inner_text()
    assert errors == []
