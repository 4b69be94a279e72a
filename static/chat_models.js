// The model picker (a server serving several models: app/http/model_registry.py). Each chat runs on its own model,
// kept in its settings (`model`; unset: its preset's, else the server's default). Picking another one says that the
// next reply reads the chat's history again (each model keeps its own cache), with about how many tokens; a model
// that is not loaded loads on the chat's next turn, and the page shows the wait.
import { api } from "./chat_api.js";
import { createSession } from "./chat_sessions.js";
import { DEFAULT_TITLE, state, ui } from "./chat_state.js";
import { el } from "./chat_view.js";

const POLL_MS = 500;
const REFRESH_MS = 5000; // the states shown (others' loads, keep-alive unloads) are refreshed this often
const STATE_LABELS = { loaded: "loaded", loading: "loading…", not_loaded: "loads on use", failed: "failed to load" };
let models = [];
let defaultModel = "";

/** The model a chat runs on: its own setting, else its preset's (`preset`: the one it follows, unless another is
 * given, as the settings form's), else the server's default. */
export function chatModel(session, preset = session && state.presets.find((p) => p.id === session.preset_id)) {
  const own = session && session.settings && session.settings.model;
  return own || (preset && preset.settings.model) || defaultModel;
}

/** What a chat on the model `name` fills in for the settings it leaves out, once that model has loaded: {values,
 * sources} (sources: server, model or built-in); null while it is not known. */
export function modelDefaults(name) {
  const model = models.find((m) => m.id === name);
  return model && model.chat_defaults ? { values: model.chat_defaults, sources: model.chat_default_sources } : null;
}

/** Fill the picker from GET /api/models (the models served, each with its state). */
export async function loadModels() {
  if (!ui.modelPicker) return;
  const data = await api("GET", "/api/models");
  defaultModel = data.default;
  takeModels(data);
  renderPicker();
}

function renderPicker() {
  const chosen = chatModel(state.current);
  const options = models.map((m) => {
    const option = el("option", null, m.id + " (" + (STATE_LABELS[m.state] || m.state) + ")");
    option.value = m.id;
    return option;
  });
  if (chosen && !models.some((m) => m.id === chosen)) {  // a model this server no longer serves
    const gone = el("option", null, chosen + " (no longer served)");
    gone.value = chosen;
    gone.disabled = true;
    options.push(gone);
  }
  ui.modelPicker.replaceChildren(...options);
  ui.modelPicker.value = chosen;
  const footer = document.querySelector(".model-name"); // the sidebar's foot names the open chat's model
  if (footer) footer.textContent = chosen;
  const served = models.some((m) => m.id === chosen);
  ui.modelPicker.setAttribute("aria-invalid", served ? "false" : "true");
  if (!served) {
    note("gone", "This chat's model " + chosen + " is no longer served: pick another to go on.");
  } else if (ui.modelNote.dataset.kind === "gone") {
    note(null, "");
  }
}

/** The line under the header: `kind` gone (the chat's model is not served), switch (the next reply reads the
 * history again) or loading; null hides it. */
function note(kind, text) {
  ui.modelNote.textContent = text;
  ui.modelNote.hidden = kind === null;
  if (kind === null) delete ui.modelNote.dataset.kind;
  else ui.modelNote.dataset.kind = kind;
}

/** The open chat changed (opened, saved): show its model. */
export function showChatModel() {
  if (ui.modelPicker && models.length) renderPicker();
}

async function pickModel() {
  const model = ui.modelPicker.value;
  const before = chatModel(state.current);
  if (!state.current) await createSession(DEFAULT_TITLE);
  const settings = Object.assign({}, state.current.settings || {}, { model });
  const updated = await api("PATCH", "/api/sessions/" + encodeURIComponent(state.current.id), { settings });
  Object.assign(state.current, updated);
  renderPicker();
  document.dispatchEvent(new Event("chat-model-change")); // the settings panel shows the new model's defaults
  if (model === before || !document.querySelector("#messages .msg")) return;
  let tokens = null;
  try {  // the history as the chat's current model counts it (the new one may not be loaded yet)
    tokens = (await api("POST", "/api/sessions/" + encodeURIComponent(state.current.id) + "/plan", {})).prompt_tokens;
  } catch (e) {
    tokens = null;
  }
  note("switch", "The next reply runs on " + model + ": it reads this chat's history again" +
    (tokens ? " (about " + tokens + " tokens)" : "") + ", since each model keeps its own cache.");
}

/** A turn was sent: while its model is not loaded yet, say so (with the seconds spent loading) until the reply
 * starts (or the turn is refused). */
export async function watchLoading() {
  if (!ui.modelPicker) return;
  const name = chatModel(state.current);
  let shown = false;
  while (state.awaitingStart) {
    let data;
    try {
      data = await api("GET", "/api/models");
    } catch (e) {
      break;
    }
    takeModels(data);
    const model = models.find((m) => m.id === name);
    if (!model || model.state === "loaded" || model.state === "failed") break;
    if (model.state === "loading") {
      shown = true;
      note("loading", "Loading " + name + "… " + Math.round(model.loading_seconds || 0) + " s");
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
  if (shown || ui.modelNote.dataset.kind === "switch") note(null, ""); // the turn has gone out: its notes are done
  renderPicker();
}

/** Take a new GET /api/models answer; a model that has loaded since brings its own defaults to the settings form. */
function takeModels(data) {
  const known = (list) => list.filter((m) => m.chat_defaults).map((m) => m.id).join("\n");
  const before = known(models);
  models = data.models;
  if (known(models) !== before) document.dispatchEvent(new Event("chat-model-change"));
}

async function refreshStates() {
  if (document.hidden || state.awaitingStart) return; // watchLoading polls meanwhile
  try {
    const data = await api("GET", "/api/models");
    takeModels(data);
    if (document.activeElement !== ui.modelPicker) renderPicker(); // never under an open dropdown
  } catch (e) {
    // the connection line says when the server cannot be reached
  }
}

export function bindModels() {
  if (!ui.modelPicker) return;
  setInterval(refreshStates, REFRESH_MS);
  ui.modelPicker.addEventListener("change", () => pickModel().catch((e) => {
    renderPicker(); // back to the model the chat still runs on
    note("error", e.message);
  }));
}
