// What /v1/models says about each model, read whichever way the server spells it.

// Capability names the page knows, and the spellings servers use for them.
const SPELLINGS = {
  chat: ["chat", "text", "completion", "completions", "text_generation", "lm", "generate"],
  vision: ["vision", "multimodal", "image_input"],
  embedding: ["embedding", "embeddings", "embed"],
  rerank: ["rerank", "reranking", "reranker"],
  transcription: ["transcription", "transcribe", "whisper", "speech_to_text", "audio_input"],
  speech: ["speech", "tts", "text_to_speech", "audio_output"],
  image: ["image", "images", "image_generation", "image-generation", "image_edit"],
};
const CANONICAL = new Map(
  Object.entries(SPELLINGS).flatMap(([name, spellings]) => spellings.map((s) => [s, name])),
);

function capabilityNames(raw) {
  if (Array.isArray(raw)) return raw.map((item) => (typeof item === "string" ? item : item?.name));
  if (raw && typeof raw === "object") {
    return Object.entries(raw).filter(([, on]) => on).map(([name]) => name);
  }
  return typeof raw === "string" ? [raw] : [];
}

/** One model of the list as {id, state, reason, capabilities: Set, multiVector}. */
export function describeModel(entry) {
  const meta = entry.meta ?? {};
  const raw = entry.capabilities ?? meta.capabilities ?? entry.model_type ?? meta.kind;
  const capabilities = new Set();
  for (const name of capabilityNames(raw)) {
    const known = CANONICAL.get(String(name).toLowerCase());
    if (known) capabilities.add(known);
  }
  // A server that says nothing about capabilities serves chat.
  if (raw === undefined) capabilities.add("chat");
  if (capabilities.has("vision")) capabilities.add("chat");
  const status = entry.state ?? entry.status ?? meta.state ?? null;
  const state = typeof status === "object" && status !== null ? status.value ?? null : status;
  const reason = entry.reason ?? status?.reason ?? entry.error ?? meta.reason ?? null;
  // A late-interaction model answers a matrix per input (ours says so as multi_vector).
  const multiVector = entry.multi_vector === true;
  return { id: entry.id, state, reason, capabilities, multiVector };
}

/** Every model of a /v1/models body, described. */
export function describeModels(body) {
  return (body?.data ?? []).filter((entry) => entry?.id).map(describeModel);
}

/** The models that have a capability. */
export const withCapability = (models, name) => models.filter((m) => m.capabilities.has(name));
