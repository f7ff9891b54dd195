// Panels for the models served beside chat, each shown only when a model has its capability:
// embedding/rerank scores, transcription, speech and image generation (OpenAI's route shapes).
import { postJson, request } from "./api.js";
import { withCapability } from "./models.js";
import { livePanel } from "./realtime.js";
import { dataUrl, el } from "./util.js";

/** Cosine similarity of two vectors. */
export function cosine(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i += 1) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}

/** Documents with their scores, best first. */
export function ranked(documents, scores) {
  return documents
    .map((text, index) => ({ index, text, score: scores[index] }))
    .sort((a, b) => b.score - a.score);
}

/** The /v1/embeddings input: the query (its text, or an image as a data: URL), then the
 * documents. */
export function scoreInput(query, image, documents) {
  return [image ? { type: "image_url", image_url: { url: image } } : query, ...documents];
}

async function scoreDocuments(model, query, image, documents) {
  // A multi-vector (late-interaction) model scores by MaxSim on /v1/rerank.
  if (model.capability === "rerank" || model.multiVector) {
    if (image) throw new Error(`${model.id} ranks text only: clear the query image`);
    const body = await postJson("/v1/rerank", { model: model.id, query, documents });
    const scores = [];
    for (const result of body.results) scores[result.index] = result.relevance_score;
    return scores;
  }
  const input = scoreInput(query, image, documents);
  const body = await postJson("/v1/embeddings", { model: model.id, input });
  const vectors = [...body.data].sort((a, b) => a.index - b.index).map((d) => d.embedding);
  return vectors.slice(1).map((vector) => cosine(vectors[0], vector));
}

function scoresPanel(form, output) {
  const query = el("input", { name: "query", placeholder: "Query", "aria-label": "Query" });
  const documents = el("textarea", {
    name: "documents",
    rows: 6,
    placeholder: "One document per line",
    "aria-label": "Documents",
  });
  const image = el("input", {
    type: "file",
    name: "image",
    accept: "image/png,image/jpeg,image/webp,image/gif",
    "aria-label": "Query image (image-text models)",
  });
  form.append(query, el("label", { class: "file" }, "Or an image as the query ", image), documents);
  return async (model) => {
    const docs = documents.value.split("\n").map((line) => line.trim()).filter(Boolean);
    const picture = image.files[0] ? await dataUrl(image.files[0]) : null;
    if (!(query.value.trim() || picture) || !docs.length) {
      throw new Error("Enter a query (or choose an image) and some documents");
    }
    const scores = await scoreDocuments(model, query.value, picture, docs);
    const rows = ranked(docs, scores).map((row) =>
      el(
        "tr",
        {},
        el("td", { class: "score" }, row.score.toFixed(4)),
        el("td", {}, el("meter", { min: 0, max: 1, value: Math.max(0, row.score) })),
        el("td", {}, row.text),
      ),
    );
    output.replaceChildren(el("table", { class: "scores" }, el("tbody", {}, ...rows)));
  };
}

function transcribePanel(form, output) {
  const file = el("input", { type: "file", accept: "audio/*", "aria-label": "Audio file" });
  form.append(file);
  let recorded = null;
  if (navigator.mediaDevices?.getUserMedia && window.MediaRecorder) {
    const record = el("button", { type: "button", class: "action" }, "Record");
    let recorder = null;
    record.addEventListener("click", async () => {
      if (recorder) {
        recorder.stop();
        return;
      }
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      const chunks = [];
      recorder = new MediaRecorder(stream);
      recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
      recorder.addEventListener("stop", () => {
        stream.getTracks().forEach((track) => track.stop());
        recorded = new File(chunks, "recording.webm", { type: recorder.mimeType });
        recorder = null;
        record.textContent = "Record again";
      });
      recorder.start();
      record.textContent = "Stop recording";
    });
    form.append(record);
  }
  return async (model) => {
    const audio = file.files[0] ?? recorded;
    if (!audio) throw new Error("Choose an audio file or record one");
    const data = new FormData();
    data.append("model", model.id);
    data.append("file", audio);
    const response = await request("/v1/audio/transcriptions", { method: "POST", body: data });
    output.replaceChildren(el("p", { class: "transcript" }, (await response.json()).text));
  };
}

function speechPanel(form, output) {
  const text = el("textarea", { rows: 4, placeholder: "Text to speak", "aria-label": "Text" });
  const voice = el("input", { placeholder: "Voice (optional)", "aria-label": "Voice" });
  form.append(text, voice);
  return async (model) => {
    if (!text.value.trim()) throw new Error("Enter some text");
    const body = { model: model.id, input: text.value };
    if (voice.value.trim()) body.voice = voice.value.trim();
    const response = await request("/v1/audio/speech", { method: "POST", body });
    const url = URL.createObjectURL(await response.blob());
    output.replaceChildren(el("audio", { controls: true, autoplay: true, src: url }));
  };
}

function imagesPanel(form, output) {
  const prompt = el("textarea", { rows: 3, placeholder: "Describe an image", "aria-label": "Prompt" });
  const size = el("select", { "aria-label": "Size" });
  for (const option of ["512x512", "256x256", "1024x1024"]) size.append(el("option", {}, option));
  form.append(prompt, size);
  return async (model) => {
    if (!prompt.value.trim()) throw new Error("Enter a prompt");
    const body = { model: model.id, prompt: prompt.value, size: size.value, response_format: "b64_json" };
    const { data } = await postJson("/v1/images/generations", body);
    const images = data.map((image) =>
      el("img", { alt: prompt.value, src: image.b64_json ? `data:image/png;base64,${image.b64_json}` : image.url }),
    );
    output.replaceChildren(el("div", { class: "generated" }, ...images));
  };
}

const PANELS = [
  { id: "scores", label: "Embeddings", capabilities: ["rerank", "embedding"], build: scoresPanel },
  { id: "transcribe", label: "Transcribe", capabilities: ["transcription"], build: transcribePanel },
  { id: "live", label: "Live", capabilities: ["transcription"], build: livePanel },
  { id: "speech", label: "Speech", capabilities: ["speech"], build: speechPanel },
  { id: "images", label: "Images", capabilities: ["image"], build: imagesPanel },
];

/** The panels the served models allow, each with the models that can serve it. */
export function availablePanels(models) {
  return PANELS.map((panel) => ({
    ...panel,
    models: panel.capabilities.flatMap((capability) =>
      withCapability(models, capability).map((model) => ({
        id: model.id,
        capability,
        ...(model.multiVector ? { multiVector: true } : {}),
      })),
    ),
  })).filter((panel) => panel.models.length);
}

/** A panel's view: its model picker, inputs, a Run button, and where results and errors go. */
export function panelView(panel) {
  const picker = el("select", { "aria-label": "Model" });
  panel.models.forEach((model, i) => picker.append(el("option", { value: i }, model.id)));
  const run = el("button", { type: "submit", class: "action primary" }, "Run");
  const form = el("form", { class: "tool-form" }, picker);
  const output = el("div", { class: "tool-output", "aria-live": "polite" });
  const error = el("div", { class: "error", role: "alert", hidden: true });
  const perform = panel.build(form, output, run);
  form.append(run);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    run.disabled = true;
    try {
      await perform(panel.models[Number(picker.value)]);
    } catch (failure) {
      error.textContent = failure.message;
      error.hidden = false;
    } finally {
      run.disabled = false;
    }
  });
  return el("section", { class: "tool-panel", id: `panel-${panel.id}` }, form, error, output);
}
