// Talking to the server: same-origin requests only, the API key from session storage, the
// error envelope read into ApiError, and server-sent events parsed as they arrive.

const KEY_ITEM = "mlxcel.apiKey";

export const apiKey = {
  get: () => sessionStorage.getItem(KEY_ITEM),
  set: (key) => sessionStorage.setItem(KEY_ITEM, key),
  clear: () => sessionStorage.removeItem(KEY_ITEM),
};

/** An error answer: its HTTP status (0 for an error event inside a stream) and envelope. */
export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let code = null;
  try {
    const body = await response.json();
    if (body?.error?.message) ({ message, code = null } = body.error);
  } catch {
    // Not the envelope (a proxy's page, say): the status line says enough.
  }
  return new ApiError(response.status, message, code);
}

/** fetch() on a path of this origin, with the key; an error status throws ApiError. */
export async function request(path, { method = "GET", body, signal } = {}) {
  // The key goes only to the origin that served the page.
  if (!path.startsWith("/") || path.startsWith("//")) throw new Error(`not a local path: ${path}`);
  const headers = {};
  const key = apiKey.get();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, signal, credentials: "same-origin" };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJson(path, signal) {
  return (await request(path, { signal })).json();
}

export async function postJson(path, body, signal) {
  return (await request(path, { method: "POST", body, signal })).json();
}

/** Splits an event stream into the `data` of each event, however the bytes were chunked. */
export class SseParser {
  constructor() {
    this.buffer = "";
  }

  /** Feed text; returns the data strings of the events it completed. */
  push(text) {
    this.buffer += text;
    const events = [];
    for (;;) {
      const end = this.buffer.search(/\r?\n\r?\n/);
      if (end < 0) return events;
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""));
      if (data.length) events.push(data.join("\n"));
    }
  }
}

/** The `data` of each event of a server-sent event response, as the bytes arrive. */
export async function* eventData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** Each JSON payload of an SSE response until [DONE]; an error event throws ApiError. */
export async function* events(response) {
  for await (const data of eventData(response)) {
    if (data === "[DONE]") return;
    const payload = JSON.parse(data);
    if (payload.error) throw new ApiError(0, payload.error.message, payload.error.code);
    yield payload;
  }
}
