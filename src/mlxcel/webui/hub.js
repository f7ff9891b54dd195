// The Models panel: what the server serves (state, memory; load, unload), what is on this
// machine (GET /models/local; load under a name, remove), and pulling from the Hugging Face
// Hub with a live progress bar (POST /models/pull and its server-sent events; cancel).
import { ApiError, eventData, getJson, postJson, request } from "./api.js";
import { el } from "./util.js";

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** "1.5 GiB", "812 KiB", "0 B"; "–" when unknown. */
export function formatBytes(bytes) {
  if (typeof bytes !== "number" || !Number.isFinite(bytes) || bytes < 0) return "–";
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}

/** "1 h 2 min", "3 min 5 s", "42 s". */
export function formatSeconds(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return "";
  const s = Math.round(seconds);
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${s} s`;
}

/** A pull's state or event as {fraction (0..1, or null when the size is unknown), text}. */
export function pullProgress(event) {
  const done = event.done_bytes ?? 0;
  const total = event.total_bytes ?? 0;
  const fraction = total > 0 ? Math.min(1, done / total) : null;
  const parts = [total > 0 ? `${formatBytes(done)} of ${formatBytes(total)}` : formatBytes(done)];
  if (fraction !== null) parts.unshift(`${Math.floor(fraction * 100)}%`);
  const status = event.type ?? event.status;
  if (status === "done") return { fraction: 1, text: `Done: ${formatBytes(total || done)}` };
  if (status === "failed") return { fraction, text: `Failed: ${event.error ?? "unknown error"}` };
  if (status === "cancelled") return { fraction, text: `Cancelled at ${parts.join(" · ")}` };
  if (event.rate_bytes_per_s) parts.push(`${formatBytes(event.rate_bytes_per_s)}/s`);
  const eta = formatSeconds(event.eta_s);
  if (eta && fraction !== 1) parts.push(`${eta} left`);
  return { fraction, text: parts.join(" · ") };
}

/** A name to serve a model on disk as: "org/Foo-GGUF:foo-Q4_K_M.gguf" -> "foo-q4_k_m". */
export function servedName(diskName) {
  const [repo, file] = diskName.split(":");
  const base = file ? file.replace(/\.gguf$/i, "") : repo.split("/").pop();
  return base.toLowerCase().replace(/[^a-z0-9._-]+/g, "-").replace(/^-+|-+$/g, "") || "model";
}

/** Each event of a pull's stream as it comes, until its last (done, failed or cancelled). */
async function* pullEvents(id, signal) {
  const response = await request(`/models/pull/${encodeURIComponent(id)}/events`, { signal });
  for await (const data of eventData(response)) yield JSON.parse(data);
}

const button = (label, onclick, attrs = {}) =>
  el("button", { type: "button", class: "action", onclick, ...attrs }, label);

/** The Models panel; `changed` is called after a model was loaded, unloaded or added. */
export function modelsPanel(changed = () => {}) {
  const error = el("div", { class: "error", role: "alert", hidden: true });
  const served = el("tbody", { id: "served-models" });
  const onDisk = el("tbody", { id: "local-models" });
  const note = el("p", { class: "hint", id: "downloads-note", hidden: true });

  const fail = (failure) => {
    error.textContent = failure instanceof ApiError || failure instanceof Error ? failure.message : String(failure);
    error.hidden = false;
  };
  // Run an action with its button disabled, then draw both lists again.
  const act = (run) => async (event) => {
    const target = event?.currentTarget;
    error.hidden = true;
    if (target) target.disabled = true;
    try {
      await run();
    } catch (failure) {
      fail(failure);
    } finally {
      if (target) target.disabled = false;
      await refresh();
    }
  };

  async function drawServed() {
    const { data } = await getJson("/v1/models");
    served.replaceChildren(
      ...data
        .filter((m) => m.object === "model" && m.state !== undefined)
        .map((m) => {
          const loaded = m.state === "loaded" || m.state === "loading";
          const toggle = loaded
            ? button("Unload", act(() => postJson("/models/unload", { model: m.id }).then(changed)))
            : button("Load", act(() => postJson("/models/load", { model: m.id }).then(changed)));
          return el(
            "tr",
            { "data-model": m.id },
            el("td", {}, m.id),
            el("td", { class: "state", title: m.reason ?? "" }, m.state),
            // Measured while loaded; for a model not loaded now, what it took when it last was.
            el(
              "td",
              { class: loaded ? "num" : "num muted", title: loaded ? "" : "when it was last loaded" },
              m.meta?.memory_bytes ? formatBytes(m.meta.memory_bytes) : "–",
            ),
            el("td", {}, toggle),
          );
        }),
    );
  }

  async function drawLocal() {
    const body = await getJson("/models/local");
    note.hidden = body.downloads !== false;
    note.textContent =
      "Downloads are off on this server (start it with --allow-downloads to pull, add and remove models here).";
    onDisk.replaceChildren(
      ...body.data.map((m) => {
        const name = el("input", { value: servedName(m.name), "aria-label": `Serve ${m.name} as`, size: 14 });
        const load = button(
          "Load",
          act(async () => {
            const as = name.value.trim();
            if (!as) throw new Error("Give a name to serve it as");
            await postJson("/models/load", { model: as, path: m.name });
            changed();
          }),
        );
        const packaged = !m.name.includes("/");
        const remove = button(
          "Remove",
          act(async () => {
            if (!window.confirm(`Remove ${m.name} from disk?`)) return;
            await request(`/models/${encodeURI(m.name)}`, { method: "DELETE" });
          }),
          { disabled: packaged, title: packaged ? "Packaged with mlxcel" : "Delete from the cache" },
        );
        return el(
          "tr",
          { "data-model": m.name, title: m.path ?? "" },
          el("td", {}, m.name),
          el("td", {}, m.kind),
          el("td", {}, m.quantization ?? ""),
          el("td", { class: "num" }, formatBytes(m.size_bytes)),
          el("td", { class: "row-actions" }, name, load, remove),
        );
      }),
    );
  }

  async function refresh() {
    const [a, b] = await Promise.allSettled([drawServed(), drawLocal()]);
    for (const result of [a, b]) if (result.status === "rejected") fail(result.reason);
  }

  // ---- pull ----
  const repo = el("input", {
    name: "model",
    placeholder: "ORG/NAME or ORG/NAME:Q4_K_M",
    "aria-label": "Model to pull",
    required: true,
  });
  const pull = el("button", { type: "submit", class: "action primary" }, "Pull");
  const cancel = el("button", { type: "button", class: "action", hidden: true }, "Cancel");
  const bar = el("progress", { max: 1, "aria-label": "Pull progress", hidden: true });
  const progress = el("span", { class: "pull-progress", role: "status" });
  const form = el("form", { class: "tool-form pull-form" }, el("div", { class: "row" }, repo, pull, cancel), bar, progress);
  let job = null;

  const show = (event) => {
    const { fraction, text } = pullProgress(event);
    bar.hidden = false;
    if (fraction === null) bar.removeAttribute("value");
    else bar.value = fraction;
    progress.textContent = text;
    form.dataset.status = event.type ?? event.status;
  };
  cancel.addEventListener("click", async () => {
    if (!job) return;
    try {
      await request(`/models/pull/${encodeURIComponent(job)}`, { method: "DELETE" });
    } catch (failure) {
      fail(failure);
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    pull.disabled = true;
    try {
      const state = await postJson("/models/pull", { model: repo.value.trim() });
      job = state.id;
      cancel.hidden = false;
      show(state);
      for await (const update of pullEvents(job)) {
        show(update);
        if (update.type === "failed") fail(new Error(update.error ?? "the pull failed"));
      }
    } catch (failure) {
      fail(failure);
    } finally {
      job = null;
      cancel.hidden = true;
      pull.disabled = false;
      await refresh();
    }
  });

  const table = (body, ...heads) =>
    el(
      "div",
      { class: "table" },
      el("table", { class: "models-table" }, el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))), body),
    );
  const view = el(
    "section",
    { class: "tool-panel models-panel", id: "panel-models" },
    error,
    el("h3", {}, "Served"),
    table(served, "Model", "State", "Memory", ""),
    el("h3", {}, "On this machine"),
    note,
    table(onDisk, "Name", "Kind", "Quantization", "Size", ""),
    el("h3", {}, "Pull from the Hugging Face Hub"),
    form,
  );
  return { view, refresh };
}
