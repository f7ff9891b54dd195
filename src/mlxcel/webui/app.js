// The playground page: conversations, the model picker, the composer, settings and the key.
import { ApiError, apiKey, getJson } from "./api.js";
import { drawEditor, drawMessage, streamReply } from "./chat.js";
import { modelsPanel } from "./hub.js";
import { describeModels, withCapability } from "./models.js";
import { fillForm, numberInputs, readForm, requestBody, showDefaults } from "./settings.js";
import * as store from "./store.js";
import { availablePanels, panelView } from "./tools.js";
import { copyText, dataUrl, download, el, icon } from "./util.js";

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const state = {
  models: [],
  conversation: null,
  controller: null, // the AbortController of the reply being streamed
  attachments: [], // data: URLs of images for the next message
  editing: null, // index of the user message being edited
};

// ---- API key -------------------------------------------------------------------------------

let keyWaiters = [];

/** Ask for the key (once, however many requests wait for it); resolves when one is entered. */
function askForKey(error) {
  const dialog = $("key-dialog");
  $("key-message").textContent = apiKey.get()
    ? `The server refused this key: ${error.message}. Enter another.`
    : "This server needs an API key.";
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

function keySubmitted(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  apiKey.set(key);
  $("key-input").value = "";
  $("key-dialog").close();
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((resolve) => resolve());
}

// ---- models --------------------------------------------------------------------------------

function setStatus(text) {
  $("status").textContent = text;
}

async function loadModels() {
  for (;;) {
    try {
      state.models = describeModels(await getJson("/v1/models"));
      setStatus("");
      return;
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        await askForKey(error);
        continue;
      }
      setStatus(error instanceof ApiError ? error.message : "Cannot reach the server; retrying");
      await sleep(1000);
    }
  }
}

const chatModels = () => withCapability(state.models, "chat");
const currentModel = () => state.models.find((m) => m.id === state.conversation.model);

function drawModelPicker() {
  const picker = $("model");
  const models = chatModels();
  picker.replaceChildren(
    ...models.map((m) => {
      const label = m.state && m.state !== "loaded" ? `${m.id} (${m.state})` : m.id;
      return el("option", { value: m.id, title: m.reason ?? "" }, label);
    }),
  );
  // Before the list arrives a conversation keeps the model it was saved with.
  if (models.length && !models.some((m) => m.id === state.conversation.model)) {
    state.conversation.model = models[0].id;
  }
  picker.value = state.conversation.model ?? "";
  picker.disabled = !models.length;
  const model = currentModel();
  const extras = model ? [...model.capabilities].filter((c) => c !== "chat") : [];
  $("model-info").textContent = extras.join(", ");
  $("model-info").title = model?.reason ?? "";
  $("attach").hidden = !model?.capabilities.has("vision");
  loadDefaults();
}

/** Read the list again after a reply: a model may have loaded (or unloaded) meanwhile. */
async function refreshModels() {
  try {
    state.models = describeModels(await getJson("/v1/models"));
    drawModelPicker();
  } catch {
    // The next reply says what is wrong, if anything still is.
  }
}

async function loadDefaults() {
  const model = state.conversation.model;
  if (!model) return;
  try {
    const props = await getJson(`/props?model=${encodeURIComponent(model)}`);
    showDefaults($("settings-form"), props.default_generation_settings?.params);
  } catch {
    // A server without llama-server's /props: the placeholders say "server default".
    showDefaults($("settings-form"), null);
  }
}

// ---- conversations -------------------------------------------------------------------------

function save() {
  try {
    store.saveConversation(state.conversation);
    setStatus("");
  } catch (error) {
    setStatus(error.message);
  }
  drawConversations();
}

function open(conversation) {
  state.conversation = conversation;
  state.editing = null;
  fillForm($("settings-form"), conversation.settings);
  $("settings-error").hidden = true;
  drawConversations();
  drawModelPicker();
  drawMessages();
  closeSidebarOnPhone();
  $("prompt").focus();
}

function newChat() {
  if (state.controller) return;
  const settings = state.conversation?.settings ?? store.defaultSettings();
  open(store.newConversation(state.conversation?.model ?? chatModels()[0]?.id, settings));
}

function rename(conversation, item) {
  const input = el("input", { class: "rename", "aria-label": "Conversation name" });
  input.value = store.titleOf(conversation);
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) conversation.title = input.value.trim();
    // A new name does not move the conversation up the list.
    store.saveConversation(conversation, false);
    drawConversations();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") {
      event.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
  item.replaceChildren(input);
  input.select();
}

function remove(conversation) {
  if (!window.confirm(`Delete "${store.titleOf(conversation)}"?`)) return;
  store.deleteConversation(conversation.id);
  if (conversation.id === state.conversation.id) {
    open(store.listConversations()[0] ?? store.newConversation(state.conversation.model));
  } else drawConversations();
}

const fileName = (title) => title.replace(/[^\w-]+/g, "_").replace(/^_+|_+$/g, "") || "chat";

function drawConversations() {
  const saved = store.listConversations();
  const items = saved.map((conversation) => {
    const current = conversation.id === state.conversation.id;
    const item = el("li", { class: current ? "current" : "" });
    const title = store.titleOf(conversation);
    item.append(
      el("button", { type: "button", class: "open", "aria-current": current ? "true" : false,
        onclick: () => !state.controller && open(conversation) }, title),
      el("span", { class: "item-actions" },
        el("button", { type: "button", "aria-label": `Rename ${title}`, title: "Rename",
          onclick: () => rename(conversation, item) }, icon("rename")),
        el("button", { type: "button", "aria-label": `Export ${title}`, title: "Export as JSON",
          onclick: () => download(`${fileName(title)}.json`, store.exportJson(conversation)) },
          icon("export")),
        el("button", { type: "button", "aria-label": `Delete ${title}`, title: "Delete",
          onclick: () => remove(conversation) }, icon("delete")),
      ),
    );
    return item;
  });
  $("conversations").replaceChildren(...items);
}

// ---- messages ------------------------------------------------------------------------------

function nearBottom() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function actionsFor(index) {
  const messages = state.conversation.messages;
  const message = messages[index];
  const last = index === messages.length - 1;
  const idle = !state.controller;
  return {
    streaming: Boolean(state.controller) && last && message.role === "assistant",
    copy: () => copyText(message.content),
    edit: idle && message.role === "user" ? () => startEdit(index) : null,
    regenerate: idle && last && message.role === "assistant" ? regenerate : null,
  };
}

function drawMessages() {
  const box = $("messages");
  const messages = state.conversation.messages;
  if (!messages.length) {
    const model = state.conversation.model;
    const line = model ? `Chatting with ${model}.` : "Waiting for the server's models.";
    box.replaceChildren(el("div", { class: "empty" }, el("h1", {}, "mlxcel"), el("p", {}, line)));
    return;
  }
  box.replaceChildren(
    ...messages.map((message, index) => {
      const node = el("article", { "data-index": index });
      if (state.editing === index) {
        drawEditor(node, message, { send: (text) => resendEdited(index, text), cancel: cancelEdit });
      } else drawMessage(node, message, actionsFor(index));
      return node;
    }),
  );
}

function redrawLast() {
  const box = $("messages");
  const follow = nearBottom();
  const index = state.conversation.messages.length - 1;
  const node = box.querySelector(`article[data-index="${index}"]`);
  if (node) drawMessage(node, state.conversation.messages[index], actionsFor(index));
  if (follow) box.scrollTop = box.scrollHeight;
}

let frame = 0;
function scheduleRedraw() {
  frame ||= requestAnimationFrame(() => {
    frame = 0;
    redrawLast();
  });
}

function setStreaming(controller) {
  state.controller = controller;
  $("send").hidden = Boolean(controller);
  $("stop").hidden = !controller;
  $("new-chat").disabled = Boolean(controller);
}

/** The request for a reply to `messages`, or null (and the reason shown) if a setting is bad. */
function prepare(messages) {
  const conversation = state.conversation;
  const history = messages.filter((m) => !m.error || m.content);
  try {
    const settings = readForm($("settings-form"), conversation.settings);
    return requestBody(settings, conversation.model, history);
  } catch (error) {
    $("settings-error").textContent = error.message;
    $("settings-error").hidden = false;
    openSettings(true);
    return null;
  }
}

/** Stream the reply to `body` into a new assistant message. */
async function reply(body) {
  const conversation = state.conversation;
  const message = { role: "assistant", content: "", model: conversation.model };
  conversation.messages.push(message);
  const controller = new AbortController();
  setStreaming(controller);
  drawMessages();
  $("messages").scrollTop = $("messages").scrollHeight;
  try {
    await streamReply(body, message, controller.signal, scheduleRedraw);
  } catch (error) {
    if (controller.signal.aborted) message.stopped = true;
    else if (error instanceof ApiError && error.status === 401) {
      conversation.messages.pop();
      setStreaming(null);
      drawMessages();
      await askForKey(error);
      return reply(body);
    } else message.error = error.message;
  } finally {
    if (state.controller === controller) setStreaming(null);
  }
  if (!message.content && !message.reasoning && !message.tool_calls && !message.error) {
    message.error = message.stopped ? "Stopped before the first token." : "The reply was empty.";
  }
  const follow = nearBottom();
  save();
  drawMessages();
  if (follow) $("messages").scrollTop = $("messages").scrollHeight;
  refreshModels();
}

function send() {
  const text = $("prompt").value;
  if (state.controller || (!text.trim() && !state.attachments.length)) return;
  if (!state.conversation.model) {
    setStatus("No chat model is served");
    return;
  }
  const message = { role: "user", content: text };
  if (state.attachments.length) message.images = state.attachments;
  const body = prepare([...state.conversation.messages, message]);
  if (!body) return;
  state.conversation.messages.push(message);
  state.attachments = [];
  drawAttachments();
  $("prompt").value = "";
  resizePrompt();
  save();
  reply(body);
}

function stop() {
  state.controller?.abort();
}

function regenerate() {
  const body = prepare(state.conversation.messages.slice(0, -1));
  if (!body) return;
  state.conversation.messages.pop();
  reply(body);
}

function startEdit(index) {
  state.editing = index;
  drawMessages();
}

function cancelEdit() {
  state.editing = null;
  drawMessages();
}

function resendEdited(index, text) {
  if (!text.trim()) return;
  const messages = state.conversation.messages;
  const kept = [...messages.slice(0, index), { ...messages[index], content: text }];
  const body = prepare(kept);
  if (!body) return;
  state.conversation.messages = kept;
  state.editing = null;
  save();
  reply(body);
}

// ---- composer, images, panels, layout ------------------------------------------------------

function resizePrompt() {
  const area = $("prompt");
  area.style.height = "auto";
  area.style.height = `${Math.min(area.scrollHeight, 240)}px`;
}

function drawAttachments() {
  const box = $("attachments");
  box.hidden = !state.attachments.length;
  box.replaceChildren(
    ...state.attachments.map((src, i) =>
      el("span", { class: "attachment" }, el("img", { src, alt: `image ${i + 1}` }),
        el("button", { type: "button", "aria-label": `Remove image ${i + 1}`, onclick: () => {
          state.attachments.splice(i, 1);
          drawAttachments();
        } }, "×")),
    ),
  );
}

async function attachImages(files) {
  state.attachments.push(...(await Promise.all([...files].map(dataUrl))));
  drawAttachments();
}

function drawTabs() {
  const panels = availablePanels(state.models);
  const tabs = $("tabs");
  tabs.hidden = false;
  const views = new Map(panels.map((panel) => [panel.id, panelView(panel)]));
  const models = modelsPanel(refreshModels);
  views.set("models", models.view);
  const show = (id) => {
    $("chat-view").hidden = id !== "chat";
    $("tools-view").hidden = id === "chat";
    if (id !== "chat") $("tools-view").replaceChildren(views.get(id));
    if (id === "models") models.refresh();
    for (const tab of tabs.children) tab.setAttribute("aria-pressed", String(tab.dataset.view === id));
  };
  const tab = (id, label) =>
    el("button", { type: "button", class: "tab", "data-view": id, onclick: () => show(id) }, label);
  const labels = [...panels.map((panel) => [panel.id, panel.label]), ["models", "Models"]];
  tabs.replaceChildren(tab("chat", "Chat"), ...labels.map(([id, label]) => tab(id, label)));
  show("chat");
}

const phone = () => window.matchMedia("(max-width: 760px)").matches;

function toggleSidebar(force) {
  const openNow = force ?? !$("app").classList.contains("sidebar-open");
  $("app").classList.toggle("sidebar-open", openNow);
  $("toggle-sidebar").setAttribute("aria-expanded", String(openNow));
}

function closeSidebarOnPhone() {
  if (phone()) toggleSidebar(false);
}

function openSettings(force) {
  const openNow = force ?? $("settings").hidden;
  $("settings").hidden = !openNow;
  $("toggle-settings").setAttribute("aria-expanded", String(openNow));
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("prompt").addEventListener("input", resizePrompt);
  $("stop").addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.controller && !$("key-dialog").open) stop();
  });
  $("new-chat").addEventListener("click", newChat);
  $("model").addEventListener("change", () => {
    state.conversation.model = $("model").value;
    save();
    drawModelPicker();
  });
  $("settings-form").addEventListener("input", () => {
    readForm($("settings-form"), state.conversation.settings);
    $("settings-error").hidden = true;
    save();
  });
  $("settings-form").addEventListener("submit", (event) => event.preventDefault());
  $("toggle-settings").addEventListener("click", () => openSettings());
  $("close-settings").addEventListener("click", () => openSettings(false));
  $("toggle-sidebar").addEventListener("click", () => toggleSidebar());
  // On a phone the open sidebar covers the page; a tap beside it closes it.
  document.querySelector(".main").addEventListener("click", (event) => {
    if ($("app").classList.contains("sidebar-open") && !event.target.closest("#toggle-sidebar")) {
      toggleSidebar(false);
    }
  });
  $("key-form").addEventListener("submit", keySubmitted);
  $("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("attach-input").addEventListener("change", (event) => {
    attachImages(event.target.files).catch((error) => setStatus(error.message));
    event.target.value = "";
  });
  $("messages").addEventListener("click", (event) => {
    const copy = event.target.closest(".copy-code");
    if (!copy) return;
    copyText(copy.closest(".code").querySelector("pre").textContent);
    copy.textContent = "Copied";
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
}

async function start() {
  $("number-fields").replaceChildren(...numberInputs());
  wire();
  const saved = store.listConversations();
  state.conversation = saved[0] ?? store.newConversation(null);
  open(state.conversation);
  setStatus("Connecting…");
  await loadModels();
  drawModelPicker();
  drawMessages();
  drawTabs();
  document.body.dataset.ready = "true";
}

start();
