"""Chat completions: messages -> prompt -> engine -> OpenAI chat objects, tool calls parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlxcel.engine.types import ChatTemplate, TokenEvent
from mlxcel.media.audio import SentMedia
from mlxcel.models.loaded import LoadedModel
from mlxcel.parsers.reasoning import reasoning_parser_name
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.serving.answer import AnswerStream, parse_answer, renders_special_tokens
from mlxcel.serving.chat_template import render_chat
from mlxcel.serving.logprobs import chat_logprobs
from mlxcel.serving.reasoning import (
    reasoning_tokens,
    thinking_kwargs,
)
from mlxcel.serving.text import (
    Generation,
    collect_all,
    new_id,
    prepare_choices,
    stream_all,
    system_fingerprint,
)
from mlxcel.serving.timings import answer_timings, progress_chunk, with_timings
from mlxcel.serving.tools import DEFAULT_PARSER, ToolPlan, plan_tools, template_messages, with_tools
from mlxcel.serving.usage import total_usage, usage_chunk
from mlxcel.serving.vision import laid_out, prompt_tokens


@dataclass
class ChatJob:
    """A chat request's generations and how its tools, if any, are parsed out of them."""

    generations: list[Generation]
    tools: ToolPlan | None
    reasoning: str | None = None
    """The reasoning parser's name, when the model's thinking is split from its answer."""
    legacy: bool = False
    """Tools came as legacy `functions`: the call goes back as `function_call`."""
    timings_per_token: bool = False


def _plan(
    template: ChatTemplate | None, request: ChatCompletionRequest, tool_parser: str
) -> ToolPlan | None:
    tools = [t.model_dump(exclude_none=True) for t in request.tool_defs()]
    # Legacy function calling answers with one call.
    parallel = request.parallel_tool_calls is not False and not request.legacy_functions
    return plan_tools(
        tools,
        request.tool_choice_value(),
        parallel,
        tool_parser,
        template.source if template else None,
    )


def chat_prompt(
    model: LoadedModel,
    request: ChatCompletionRequest,
    tool_parser: str = "auto",
    media: Sequence[SentMedia] = (),
) -> list[int]:
    """The prompt tokens for a chat request, through the model's own template."""
    return prompt_tokens(model, chat_text(model, request, tool_parser), media)


def chat_text(model: LoadedModel, request: ChatCompletionRequest, tool_parser: str) -> str:
    """The prompt text for a chat request, rendered by the model's own template."""
    return templated_chat(model.chat_template, request, tool_parser)


def templated_chat(
    template: ChatTemplate | None, request: ChatCompletionRequest, tool_parser: str
) -> str:
    """The prompt text for a chat request through `template` (ChatML without one)."""
    plan = _plan(template, request, tool_parser)
    tools = plan.tools if plan else []
    messages = template_messages(
        template,
        [m.template_dict() for m in request.messages],
        tools,
        plan.parser if plan else DEFAULT_PARSER,
    )
    extra = {
        **thinking_kwargs(request.reasoning_effort),
        **(request.chat_template_kwargs or {}),
        **({"tools": tools} if tools else {}),
    }
    text = render_chat(
        template,
        messages,
        add_generation_prompt=request.add_generation_prompt,
        extra=extra,
    )
    if request.continue_final_message:
        # Cut the template's end-of-turn after the last message so the model carries on it.
        last = messages[-1]["content"] or ""
        text = text[: text.rindex(last) + len(last)] if last in text else text
    return text


def prepare_chat(
    model: LoadedModel,
    request: ChatCompletionRequest,
    n_predict: int,
    tool_parser: str,
    reasoning_parser: str,
    media: Sequence[SentMedia] = (),
) -> ChatJob:
    """One generation per requested choice, sampling resolved; a forced tool call constrained."""
    plan = _plan(model.chat_template, request, tool_parser)
    text = chat_text(model, request, tool_parser)
    template = model.chat_template.source if model.chat_template else ""
    reasoning = reasoning_parser_name(reasoning_parser, text, template)
    prompt = laid_out(model, text, media)
    generations = prepare_choices(
        model,
        new_id("chatcmpl"),
        [prompt],
        request,
        request.token_limit(),
        n_predict,
        "messages",
    )
    special = renders_special_tokens(reasoning, plan)
    generations = [
        with_tools(replace(g, params=replace(g.params, render_special=special)), plan, "messages")
        for g in generations
    ]
    return ChatJob(
        generations, plan, reasoning, request.legacy_functions, request.timings_per_token
    )


def _thinking(reasoning: str | None) -> dict[str, Any]:
    """A message's reasoning fields (`reasoning` is the alias some clients read)."""
    return {"reasoning_content": reasoning, "reasoning": reasoning}


def _call_finish(finish: str, job: ChatJob) -> str:
    """The finish reason of an answer that made a call."""
    if finish != "stop":
        return finish
    return "function_call" if job.legacy else "tool_calls"


def _legacy_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """A tool-call delta as legacy function calling streams it: one function_call."""
    calls = delta.get("tool_calls")
    if not calls:
        return delta
    return {"function_call": calls[0]["function"]}


def _message(text: str, finish: str, job: ChatJob) -> tuple[dict[str, Any], str]:
    answer = parse_answer(text, job.reasoning, job.tools, truncated=finish == "length")
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if job.reasoning is not None or answer.reasoning is not None:
        message.update(_thinking(answer.reasoning))
    if not answer.tool_calls:
        return message, finish
    if job.legacy:
        message["function_call"] = answer.tool_calls[0]["function"]
    else:
        message["tool_calls"] = answer.tool_calls
    return message, _call_finish(finish, job)


async def chat_completion(job: ChatJob) -> dict[str, Any]:
    """The whole answer as one chat.completion object."""
    generations = job.generations
    outcomes = await collect_all(generations)
    first = generations[0]
    wants_logprobs = first.params.logprobs is not None
    post = first.params.post_sampling_probs
    choices: list[dict[str, Any]] = []
    for g, o in zip(generations, outcomes, strict=True):
        message, finish = _message(o.text, o.finish_reason, job)
        logprobs = chat_logprobs(o.logprobs, post) if wants_logprobs else None
        choices.append(
            {"index": g.index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        )
    usage = total_usage(generations, dict(enumerate(outcomes)))
    if job.reasoning is not None:
        thoughts = [c["message"].get("reasoning_content") or "" for c in choices]
        _count_reasoning(usage, first, thoughts)
    return {
        "id": first.request_id,
        "object": "chat.completion",
        "created": first.created,
        "model": first.model.name,
        "system_fingerprint": system_fingerprint(first.model.backend),
        "choices": choices,
        "usage": usage,
        "timings": answer_timings(generations, outcomes),
    }


def _count_reasoning(usage: dict[str, Any], generation: Generation, thoughts: list[str]) -> None:
    """Add the reasoning tokens of every choice's thinking to a chat usage object."""
    generator = generation.model.generator
    total = usage["completion_tokens"]
    spent = sum(reasoning_tokens(generator, thought, total) for thought in thoughts)
    usage["completion_tokens_details"] = {"reasoning_tokens": min(spent, total)}


def _chunk(
    generation: Generation,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": generation.index, "delta": delta, "logprobs": logprobs}
    return {
        "id": generation.request_id,
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model.name,
        "system_fingerprint": system_fingerprint(generation.model.backend),
        "choices": [{**choice, "finish_reason": finish}],
    }


async def chat_chunks(job: ChatJob, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    """chat.completion.chunk objects: each choice's role first, then text or tool-call deltas,
    then its finish."""
    generations = job.generations
    answers = [AnswerStream(job.reasoning, job.tools) for _ in generations]
    role_sent: set[int] = set()
    thoughts: dict[int, list[str]] = {}
    finals: dict[int, TokenEvent] = {}
    async for position, event in stream_all(generations):
        generation = generations[position]
        if event.progress is not None:
            yield progress_chunk(_chunk(generation, {}, None), event.progress)
            continue
        if position not in role_sent:
            role_sent.add(position)
            yield _chunk(generation, {"role": "assistant", "content": ""}, None)
        post = generation.params.post_sampling_probs
        logprobs = chat_logprobs(event.logprobs, post) if event.logprobs else None
        answer = answers[position]
        deltas = answer.feed(event.text) if event.text else []
        if event.finish_reason is not None:
            deltas += answer.finish(truncated=event.finish_reason == "length")
        for delta in deltas:
            if "reasoning_content" in delta:
                thoughts.setdefault(position, []).append(delta["reasoning_content"])
                delta = _thinking(delta["reasoning_content"])
            elif job.legacy:
                delta = _legacy_delta(delta)
            yield with_timings(
                _chunk(generation, delta, None, logprobs), job.timings_per_token, event
            )
            logprobs = None
        if logprobs:
            chunk = _chunk(generation, {"content": ""}, None, logprobs)
            yield with_timings(chunk, job.timings_per_token, event)
        if event.finish_reason is None:
            continue
        finals[position] = event
        finish = event.finish_reason
        if answer.calls:
            finish = _call_finish(finish, job)
        last = _chunk(generation, {}, finish)
        if len(finals) == len(generations):
            last["timings"] = answer_timings(generations, [finals[i] for i in sorted(finals)])
        yield last
    if include_usage:
        usage_ = total_usage(generations, finals)
        if job.reasoning is not None:
            _count_reasoning(usage_, generations[0], ["".join(t) for t in thoughts.values()])
        chunk = usage_chunk(_chunk(generations[0], {}, None), usage_)
        yield {**chunk, "timings": answer_timings(generations, [finals[i] for i in sorted(finals)])}
