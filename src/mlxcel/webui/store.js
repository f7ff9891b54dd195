// Conversations kept in the browser's local storage, one item each.
import { newId } from "./util.js";

const PREFIX = "mlxcel.conversation.";
const TITLE_LENGTH = 48;

/** Sampling and format settings a new conversation starts with (empty: the server's default). */
export function defaultSettings() {
  return {
    system: "",
    temperature: "",
    top_p: "",
    top_k: "",
    min_p: "",
    max_tokens: "",
    seed: "",
    format: "text",
    schema: "",
    extra: "",
  };
}

export function newConversation(model, settings = defaultSettings()) {
  const now = Date.now();
  return {
    id: newId(),
    title: "",
    created: now,
    updated: now,
    model,
    settings: { ...settings },
    messages: [],
  };
}

/** A title for the list: the one given, else the first user message, else "New chat". */
export function titleOf(conversation) {
  if (conversation.title) return conversation.title;
  const first = conversation.messages.find((m) => m.role === "user");
  const text = (first?.content ?? "").replace(/\s+/g, " ").trim();
  if (!text) return "New chat";
  return text.length > TITLE_LENGTH ? `${text.slice(0, TITLE_LENGTH - 1)}…` : text;
}

/** Every stored conversation, the most recently updated first. */
export function listConversations() {
  const found = [];
  for (let i = 0; i < localStorage.length; i += 1) {
    const key = localStorage.key(i);
    if (!key?.startsWith(PREFIX)) continue;
    try {
      const conversation = JSON.parse(localStorage.getItem(key));
      conversation.settings = { ...defaultSettings(), ...conversation.settings };
      found.push(conversation);
    } catch {
      // Written by something else under our prefix: leave it alone.
    }
  }
  return found.sort((a, b) => b.updated - a.updated);
}

/** Store a conversation (moved to the top unless `touch` is false); a full storage throws. */
export function saveConversation(conversation, touch = true) {
  if (touch) conversation.updated = Date.now();
  try {
    localStorage.setItem(PREFIX + conversation.id, JSON.stringify(conversation));
  } catch (error) {
    throw new Error(`could not save the conversation (${error.name}): delete some old ones`);
  }
}

export function deleteConversation(id) {
  localStorage.removeItem(PREFIX + id);
}

/** The conversation as the JSON file the export button downloads. */
export function exportJson(conversation) {
  return JSON.stringify({ ...conversation, title: titleOf(conversation) }, null, 2);
}
