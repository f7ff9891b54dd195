"""What one engine step feeds: the decoding sequences' last tokens with their drafts, and
prompt chunks within the batch (the scheduler's plan for each step)."""

from __future__ import annotations

from mlxcel.engine import media
from mlxcel.engine.sequence import Running
from mlxcel.engine.speculation import Speculation
from mlxcel.engine.types import Feed, TextGenerator


def _prompt_budget(running: list[Running], generator: TextGenerator, room: int) -> int:
    """Prompt tokens this step may feed, of the `room` the batch has.

    A prompt alone takes the whole batch. With other sequences running, a step's prompt
    chunks stop at half of it: a step costs about its token count, so two 128-token
    prompts a step instead of four halve the median time to first token of a wave of
    arrivals (each comes out a step sooner) and halve each stall of the decoding
    streams, for the same work in all (bench figures in the commit that made it)."""
    if len(running) == 1:
        return room
    return min(room, max(1, generator.max_feed_tokens // 2))


def next_feeds(
    running: list[Running], generator: TextGenerator, speculation: Speculation
) -> list[Feed]:
    """What the next step feeds: each decoding sequence's last token (and its draft), then
    the prompts' chunks, within the batch."""
    decoding = [r for r in running if not r.prefilling]
    room = max(1, generator.max_feed_tokens - len(decoding))
    budget = _prompt_budget(running, generator, room)
    prompts = []
    waiting = False  # a prompt left with more to feed after this step
    for r in running:
        if not r.prefilling:
            continue
        if budget <= 0:
            waiting = True
            continue
        end = media.chunk_end(r.job.media, r.fed, budget, len(r.job.prompt))
        chunk = r.job.prompt[r.fed : end]
        budget -= len(chunk)
        room -= len(chunk)
        # With no token to generate (max_tokens 0) the prompt is only evaluated.
        last = end == len(r.job.prompt)
        waiting = waiting or not last
        sample = last and r.job.params.max_tokens > 0
        rows = media.rows_in(r.job.media, r.fed, end)
        mrope = media.mrope_in(r.job.media, r.fed, end)
        prompts.append(Feed(r.slot, chunk, sample, rows, mrope=mrope))
    # Drafts take what the prompts leave of the batch, so they never delay a first token:
    # nothing beyond the prompts' budget while a prompt still waits for more of it.
    drafts = speculation.drafts(decoding, budget if waiting else room)
    feeds = [
        Feed(r.slot, (r.last_token,), True, draft=draft)
        for r, draft in zip(decoding, drafts, strict=True)
    ]
    return feeds + prompts
