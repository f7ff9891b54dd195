// The settings panel: its form, and the chat request a conversation's settings make.
import { el } from "./util.js";

/** Number fields: the request field, its label, and the /props default it falls back to. */
export const NUMBER_FIELDS = [
  { key: "temperature", label: "Temperature", step: "0.05", min: "0", max: "2", prop: "temperature" },
  { key: "top_p", label: "Top P", step: "0.01", min: "0", max: "1", prop: "top_p" },
  { key: "top_k", label: "Top K", step: "1", min: "0", integer: true, prop: "top_k" },
  { key: "min_p", label: "Min P", step: "0.01", min: "0", max: "1", prop: "min_p" },
  { key: "max_tokens", label: "Max tokens", step: "1", min: "1", integer: true, prop: "n_predict" },
  { key: "seed", label: "Seed", step: "1", integer: true, prop: "seed" },
];

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`${what} is not valid JSON: ${error.message}`);
  }
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

function wireMessage(message) {
  if (message.role === "user" && message.images?.length) {
    const images = message.images.map((url) => ({ type: "image_url", image_url: { url } }));
    return { role: "user", content: [{ type: "text", text: message.content }, ...images] };
  }
  return { role: message.role, content: message.content };
}

/** The streamed chat request for `messages` under `settings`; bad settings throw an Error. */
export function requestBody(settings, model, messages) {
  const body = { model, messages: [], stream: true, stream_options: { include_usage: true } };
  if (settings.system.trim()) body.messages.push({ role: "system", content: settings.system });
  body.messages.push(...messages.map(wireMessage));
  for (const field of NUMBER_FIELDS) {
    const raw = String(settings[field.key] ?? "").trim();
    if (!raw) continue;
    const value = Number(raw);
    if (!Number.isFinite(value) || (field.integer && !Number.isInteger(value))) {
      throw new Error(`${field.label}: "${raw}" is not a ${field.integer ? "whole " : ""}number`);
    }
    body[field.key] = value;
  }
  if (settings.format === "json_object") body.response_format = { type: "json_object" };
  if (settings.format === "json_schema") {
    const schema = parseJson(settings.schema, "The JSON schema");
    if (!isObject(schema)) throw new Error("The JSON schema must be an object");
    body.response_format = { type: "json_schema", json_schema: { name: "reply", schema } };
  }
  if (settings.extra.trim()) {
    const extra = parseJson(settings.extra, "Extra request fields");
    if (!isObject(extra)) throw new Error("Extra request fields must be a JSON object");
    Object.assign(body, extra);
  }
  return body;
}

/** Put a conversation's settings into the form. */
export function fillForm(form, settings) {
  for (const [name, value] of Object.entries(settings)) {
    if (form.elements[name]) form.elements[name].value = value;
  }
  showSchema(form);
}

/** The settings the form holds now. */
export function readForm(form, into) {
  for (const name of Object.keys(into)) {
    if (form.elements[name]) into[name] = form.elements[name].value;
  }
  showSchema(form);
  return into;
}

function showSchema(form) {
  form.querySelector(".schema-field").hidden = form.elements.format.value !== "json_schema";
}

/** Show what the server uses when a field is left empty (from GET /props). */
export function showDefaults(form, params) {
  for (const field of NUMBER_FIELDS) {
    const value = params?.[field.prop];
    const input = form.elements[field.key];
    const none = value === undefined || value === null || (field.key === "max_tokens" && value < 0);
    const shown = field.key === "seed" && value === 4294967295 ? "random" : value;
    input.placeholder = none ? (field.key === "max_tokens" ? "no limit" : "server default") : shown;
  }
}

/** The number inputs of the panel, built from NUMBER_FIELDS. */
export function numberInputs() {
  return NUMBER_FIELDS.map((field) => {
    const input = el("input", {
      type: "number",
      name: field.key,
      step: field.step,
      min: field.min,
      max: field.max,
      inputmode: field.integer ? "numeric" : "decimal",
    });
    return el("label", { class: "field" }, field.label, input);
  });
}
