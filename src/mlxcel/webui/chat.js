// One chat turn: streaming a reply into a message, and drawing a message with its actions.
import { events, request } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { el, formatMs } from "./util.js";

function mergeToolCalls(message, deltas) {
  message.tool_calls ??= [];
  for (const delta of deltas) {
    const call = (message.tool_calls[delta.index ?? 0] ??= { id: "", name: "", arguments: "" });
    if (delta.id) call.id = delta.id;
    if (delta.function?.name) call.name += delta.function.name;
    if (delta.function?.arguments) call.arguments += delta.function.arguments;
  }
}

/** Time to first token, tokens/s after it, and the usage the server reported. */
export function streamStats(started, first, pieces, usage, now) {
  const tokens = usage?.completion_tokens ?? pieces;
  const stats = { ttft: first === null ? null : first - started, tokens, tps: null };
  // Each token after the first, over the time since the first arrived.
  if (first !== null && tokens > 1 && now > first) stats.tps = (tokens - 1) / ((now - first) / 1000);
  if (usage) {
    stats.prompt = usage.prompt_tokens;
    stats.cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    stats.reasoning = usage.completion_tokens_details?.reasoning_tokens ?? 0;
  }
  return stats;
}

/** POST `body` and grow `message` from the stream, calling `onUpdate` after each chunk. */
export async function streamReply(body, message, signal, onUpdate) {
  const started = performance.now();
  let first = null;
  let pieces = 0;
  const response = await request("/v1/chat/completions", { method: "POST", body, signal });
  for await (const chunk of events(response)) {
    if (chunk.usage) message.usage = chunk.usage;
    const choice = chunk.choices?.[0];
    const delta = choice?.delta ?? {};
    // The server sends thinking under both names; one of them is enough.
    const thinking = delta.reasoning_content ?? delta.reasoning;
    if (thinking) message.reasoning = (message.reasoning ?? "") + thinking;
    if (delta.content) message.content += delta.content;
    if (delta.tool_calls) mergeToolCalls(message, delta.tool_calls);
    if (thinking || delta.content || delta.tool_calls) {
      pieces += 1;
      first ??= performance.now();
    }
    if (choice?.finish_reason) message.finish = choice.finish_reason;
    message.stats = streamStats(started, first, pieces, message.usage, performance.now());
    onUpdate();
  }
}

/** The line under a reply: tokens, speed, time to first token, prompt and cache. */
export function statsText(stats) {
  if (!stats) return "";
  const parts = [`${stats.tokens} tokens${stats.reasoning ? ` (${stats.reasoning} reasoning)` : ""}`];
  if (stats.tps !== null) parts.push(`${stats.tps.toFixed(1)} tok/s`);
  if (stats.ttft !== null) parts.push(`first token ${formatMs(stats.ttft)}`);
  if (stats.prompt !== undefined) {
    parts.push(`prompt ${stats.prompt}${stats.cached ? ` (${stats.cached} cached)` : ""}`);
  }
  return parts.join(" · ");
}

function reasoningBlock(node, message) {
  const details = el("details", { class: "reasoning" });
  const remembered = node.dataset.reasoning;
  details.open = remembered ? remembered === "open" : !message.content && !message.tool_calls;
  const summary = el("summary", {}, message.content ? "Reasoning" : "Thinking…");
  // Remember a reader's own choice across redraws; an automatic close is not one.
  summary.addEventListener("click", () => {
    node.dataset.reasoning = details.open ? "closed" : "open";
  });
  details.append(summary, el("div", { class: "reasoning-text" }, message.reasoning));
  return details;
}

function toolCallsBlock(calls) {
  return el(
    "div",
    { class: "tool-calls" },
    ...calls.map((call) =>
      el(
        "div",
        { class: "tool-call" },
        el("div", { class: "tool-call-head" }, "Tool call ", el("code", {}, call.name || "…")),
        el("pre", {}, prettyArguments(call.arguments)),
      ),
    ),
  );
}

function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

const button = (label, onclick, extra = {}) =>
  el("button", { type: "button", class: "action", onclick, ...extra }, label);

/**
 * Draw `message` into `node`. `actions` holds what the reader may do with it:
 * copy, edit (a user message), regenerate (the last reply), and whether it is streaming.
 */
export function drawMessage(node, message, actions) {
  node.className = `msg ${message.role}${actions.streaming ? " streaming" : ""}`;
  const parts = [];
  if (message.reasoning) parts.push(reasoningBlock(node, message));
  if (message.images?.length) {
    parts.push(el("div", { class: "images" }, ...message.images.map((src) => el("img", { src, alt: "" }))));
  }
  const body = el("div", { class: "msg-body" });
  if (message.role === "user") body.textContent = message.content;
  else body.innerHTML = renderMarkdown(message.content);
  if (message.content || message.role === "user") parts.push(body);
  if (message.tool_calls?.length) parts.push(toolCallsBlock(message.tool_calls));
  if (actions.streaming && !message.content && !message.reasoning && !message.tool_calls) {
    parts.push(el("div", { class: "waiting", "aria-label": "waiting for the reply" }, "●●●"));
  }
  if (message.error) parts.push(el("div", { class: "error", role: "alert" }, message.error));
  const meta = el("footer", { class: "msg-meta" });
  if (message.role === "assistant") {
    const stopped = message.stopped ? "stopped · " : "";
    meta.append(el("span", { class: "stats" }, stopped + statsText(message.stats)));
  }
  if (!actions.streaming) {
    const tools = el("span", { class: "actions" });
    if (message.content) tools.append(button("Copy", actions.copy));
    if (actions.edit) tools.append(button("Edit", actions.edit));
    if (actions.regenerate) tools.append(button("Regenerate", actions.regenerate));
    meta.append(tools);
  }
  node.replaceChildren(...parts, meta);
}

/** An editor in place of a user message: Enter (or Send) resends, Esc cancels. */
export function drawEditor(node, message, { send, cancel }) {
  const area = el("textarea", { class: "edit-area", rows: 3, "aria-label": "Edit message" });
  area.value = message.content;
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(area.value);
    } else if (event.key === "Escape") {
      event.stopPropagation();
      cancel();
    }
  });
  const row = el(
    "div",
    { class: "edit-actions" },
    button("Cancel", cancel),
    button("Send", () => send(area.value), { class: "action primary" }),
  );
  node.className = "msg user editing";
  node.replaceChildren(area, row);
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}
