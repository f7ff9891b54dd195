"""The playground's Live panel in headless Chromium: the microphone is a fake capture device
playing a spoken clip (Chromium's --use-file-for-fake-audio-capture), streamed to /v1/realtime
and transcribed live."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.audio_util import word_error_rate
from tests.conftest import serving
from tests.realtime_util import spoken_pcm, wav_bytes
from tests.server_process import ServerProcess
from tests.test_webui import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

pytestmark = pytest.mark.slow

SENTENCE = "We will meet at the station at noon tomorrow."


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "realtime-webui", "--transcription-model", "default")


def test_the_microphone_transcribes_live(live_server: ServerProcess, tmp_path: Path) -> None:
    clip = spoken_pcm(SENTENCE, tmp_path, rate=48_000, pad_s=(0.5, 1.5))
    capture = tmp_path / "microphone.wav"
    capture.write_bytes(wav_bytes(clip, 48_000))
    heard = (
        live_server.openai()
        .audio.transcriptions.create(model="whisper-1", file=("clip.wav", capture.read_bytes()))
        .text
    )
    args = [
        *CHROMIUM_ARGS,
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={capture}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(live_server.root + "/")
            page.wait_for_selector("body[data-ready=true]")
            page.click("button.tab[data-view=live]")
            panel = page.locator("#panel-live")
            expect(panel.locator("button[type=submit]")).to_have_text("Start")
            panel.locator("button[type=submit]").click()
            expect(panel.locator("button[type=submit]")).to_have_text("Stop")
            final = panel.locator(".live-turn.final").first
            expect(final).not_to_have_text("", timeout=TIMEOUT_MS)
            said = final.text_content() or ""
            panel.locator("button[type=submit]").click()
            expect(panel.locator("button[type=submit]")).to_have_text("Start")
            assert panel.locator(".tool-output .error").count() == 0, panel.inner_text()
            assert errors == []
        finally:
            browser.close()
    # The fake device loops the file: a turn may start inside the clip, so allow more misses.
    assert word_error_rate(heard, said) <= 0.5, (heard, said)
