// The settings panel: a chat's own settings, the preset it follows, and the presets themselves. Each field says
// where its value comes from (this chat, the preset, the server's default); the server checks what is saved, and
// its error shows next to the field it names.
import { api } from "./chat_api.js";
import { chatModel, modelDefaults, showChatModel } from "./chat_models.js";
import { createSession } from "./chat_sessions.js";
import { DEFAULT_TITLE, SETTING_FIELDS, state, ui } from "./chat_state.js";
import { el } from "./chat_view.js";

const STATUS_MS = 2500;
// where a server default comes from (data-default-source): a short label, and its longer title
const SOURCE_LABELS = {
  server: ["Server default", "set by the server's flags"],
  model: ["Model's default", "from the model's generation config"],
  "built-in": ["Built-in default", "the server's built-in value"],
};
const FIELDS = ["system_prompt", ...SETTING_FIELDS];
const $ = (id) => document.getElementById(id);
const statusTimers = new Map();

// ---- reading the form --------------------------------------------------------------------------------------
function input(name) {
  return ui.settingsForm.elements[name];
}

function presetById(id) {
  return state.presets.find((p) => p.id === id) || null;
}

/** The preset the form shows (what Save would make the chat follow). */
function formPreset() {
  return presetById(input("preset_id").value);
}

/** Where an empty field's value comes from: {value, kind (preset or server), label, title}. */
function inherited(name, preset) {
  const own = preset && (name === "system_prompt" ? preset.system_prompt : preset.settings[name]);
  if (own != null && own !== "") {
    return { value: String(own), kind: "preset", label: "Preset “" + preset.name + "”", title: "" };
  }
  const field = input(name);
  // the chat's model's own defaults once it has loaded (each model has its context and generation config), else
  // the page's: --model's
  const fromModel = name === "system_prompt" ? null : modelDefaults(chatModel(state.current, preset));
  const value = fromModel && fromModel.values[name] != null ? String(fromModel.values[name]) : field.dataset.default;
  const source = fromModel ? fromModel.sources[name] : field.dataset.defaultSource;
  const [label, title] = SOURCE_LABELS[source] || SOURCE_LABELS.server;
  const none = name === "system_prompt" && !value;
  return { value, kind: "server", label: none ? label + ": none" : label, title };
}

/** Under each field, where its value comes from; an empty field shows the value it inherits, greyed. */
function showSources() {
  const preset = formPreset();
  for (const name of FIELDS) {
    const field = input(name);
    const from = inherited(name, preset);
    field.placeholder = name === "system_prompt" ? from.value || "No system prompt" : from.value;
    const own = field.value.trim() !== "" || (field.validity && field.validity.badInput);
    const line = $("src-" + name);
    line.textContent = own ? "This chat" : from.label;
    line.title = own ? "set for this chat: it wins over the preset and the server's default" : from.title;
    line.dataset.source = own ? "chat" : from.kind;
  }
}

/** The form's sampling values as numbers; null (with the error shown in place) when one is not a number. */
function readSettings() {
  const settings = {};
  let ok = true;
  for (const name of SETTING_FIELDS) {
    const field = input(name);
    const raw = field.value.trim();
    if (field.validity.badInput) {
      fieldError(name, name.replace(/_/g, " ") + " must be a number");
      ok = false;
    } else if (raw !== "") {
      const value = Number(raw);
      settings[name] = name === "max_tokens" || name === "top_k" ? Math.round(value) : value;
    }
  }
  return ok ? settings : null;
}

// ---- errors and the "Saved." line ----------------------------------------------------------------------------
function fieldError(name, message) {
  const box = $("err-" + name);
  const field = name === "name" ? $("preset-name") : input(name);
  box.textContent = message;
  if (field) field.setAttribute("aria-invalid", "true");
}

function clearErrors(root) {
  for (const box of root.querySelectorAll(".field-error, .form-error")) box.textContent = "";
  for (const field of root.querySelectorAll("[aria-invalid]")) field.removeAttribute("aria-invalid");
}

/** A server error next to the field its `param` names ("settings.temperature" -> temperature), else below all. */
function showServerError(error, fallbackBox) {
  const field = (error.param || "").replace(/^settings\./, "");
  const box = $("err-" + field);
  if (box) {
    fieldError(field, error.message.replace(/^settings\./, ""));
    const target = field === "name" ? $("preset-name") : input(field);
    if (target) target.focus();
  } else {
    fallbackBox.textContent = error.message;
  }
}

/** A passing confirmation: shown after a real success only, gone after a moment. */
function flash(box, text) {
  clearTimeout(statusTimers.get(box));
  box.textContent = text;
  statusTimers.set(box, setTimeout(() => (box.textContent = ""), STATUS_MS));
}

function clearStatus(box) {
  clearTimeout(statusTimers.get(box));
  box.textContent = "";
}

// ---- filling the panel ---------------------------------------------------------------------------------------
function presetOption(preset, suffix) {
  const option = el("option", null, preset.name + (suffix || ""));
  option.value = preset.id;
  return option;
}

function renderPresets() {
  const chosen = input("preset_id").value;
  const select = input("preset_id");
  select.replaceChildren(select.options[0], ...state.presets.map((p) => presetOption(p)));
  select.value = presetById(chosen) ? chosen : "";
  const defaults = $("default-preset");
  defaults.replaceChildren(defaults.options[0], ...state.presets.map((p) => presetOption(p)));
  defaults.value = state.defaultPresetId || "";
  const items = state.presets.map((p) => {
    const li = el("li", "preset-item");
    li.dataset.id = p.id;
    li.appendChild(el("span", "preset-name", p.name));
    if (p.is_default) li.appendChild(el("span", "preset-badge", "default"));
    const remove = el("button", "link-btn", "Delete");
    remove.type = "button";
    remove.dataset.action = "delete-preset";
    remove.setAttribute("aria-label", "Delete preset “" + p.name + "”");
    li.appendChild(remove);
    return li;
  });
  if (!items.length) items.push(el("li", "preset-none muted", "No presets yet"));
  $("preset-list").replaceChildren(...items);
}

export async function loadPresets() {
  const data = await api("GET", "/api/presets");
  state.presets = data.presets;
  state.defaultPresetId = data.default_preset_id;
  renderPresets();
}

/** The settings panel shows the open chat's own values and its preset (a blank chat: the default preset). */
export function fillSettings() {
  const session = state.current;
  const settings = (session && session.settings) || {};
  const presetId = session ? session.preset_id : state.defaultPresetId;
  input("preset_id").value = presetById(presetId) ? presetId : "";
  input("system_prompt").value = session ? session.system_prompt || "" : "";
  for (const name of SETTING_FIELDS) input(name).value = settings[name] != null ? settings[name] : "";
  clearErrors(ui.settingsPanel);
  clearStatus(ui.settingsStatus);
  showSources();
  showChatModel();
}

// ---- saving ------------------------------------------------------------------------------------------------
async function saveSettings(event) {
  event.preventDefault();
  clearErrors(ui.settingsForm);
  clearStatus(ui.settingsStatus);
  const own = readSettings();
  if (own === null) return;
  // keys the form does not show (stop, seed, ... set through the API) stay as they are
  const settings = Object.assign({}, (state.current && state.current.settings) || {});
  for (const name of SETTING_FIELDS) delete settings[name];
  Object.assign(settings, own);
  const body = { system_prompt: input("system_prompt").value, settings, preset_id: input("preset_id").value || null };
  try {
    if (!state.current) await createSession(DEFAULT_TITLE);
    const updated = await api("PATCH", "/api/sessions/" + encodeURIComponent(state.current.id), body);
    Object.assign(state.current, updated);
    fillSettings();
    flash(ui.settingsStatus, "Saved.");
  } catch (e) {
    showServerError(e, ui.settingsError);
  }
}

/** The values the form shows, own or inherited from its preset (not the server's defaults), as a preset. */
function formAsPreset() {
  const preset = formPreset();
  const own = readSettings();
  if (own === null) return null;
  const settings = Object.assign({}, preset ? preset.settings : {}, own);
  const model = state.current && state.current.settings && state.current.settings.model;
  if (model) settings.model = model;  // the chat's model goes with its preset
  const systemPrompt = input("system_prompt").value || (preset ? preset.system_prompt : "");
  return { system_prompt: systemPrompt, settings };
}

async function savePreset(event) {
  event.preventDefault();
  clearErrors(ui.settingsPanel);
  clearStatus($("preset-status"));
  const name = $("preset-name").value.trim();
  const values = formAsPreset();
  if (values === null) return;
  const existing = state.presets.find((p) => p.name === name);
  try {
    const saved = existing
      ? await api("PATCH", "/api/presets/" + encodeURIComponent(existing.id), values)
      : await api("POST", "/api/presets", Object.assign({ name }, values));
    await loadPresets();
    $("preset-name").value = "";
    flash($("preset-status"), (existing ? "Updated" : "Saved") + " preset “" + saved.name + "”.");
  } catch (e) {
    showServerError(e, $("preset-error"));
  }
}

async function setDefaultPreset() {
  clearStatus($("preset-status"));
  $("preset-error").textContent = "";
  const id = $("default-preset").value;
  try {
    if (id) await api("PATCH", "/api/presets/" + encodeURIComponent(id), { is_default: true });
    else if (state.defaultPresetId) {
      await api("PATCH", "/api/presets/" + encodeURIComponent(state.defaultPresetId), { is_default: false });
    }
    await loadPresets();
    const preset = presetById(id);
    flash($("preset-status"), preset ? "New chats start from “" + preset.name + "”." : "New chats start from no preset.");
    if (!state.current) fillSettings();
  } catch (e) {
    $("default-preset").value = state.defaultPresetId || "";
    $("preset-error").textContent = e.message;
  }
}

async function onPresetListClick(event) {
  const target = event.target.closest("[data-action]");
  const item = event.target.closest("li.preset-item");
  if (!target || !item) return;
  const preset = presetById(item.dataset.id);
  if (!preset) return;
  if (target.dataset.action === "delete-preset") {
    const box = el("div", "preset-confirm");
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", "Confirm deletion");
    box.appendChild(el("span", null, "Delete “" + preset.name + "”? Chats that follow it keep their own values."));
    for (const [label, action, cls] of [["Delete", "confirm-delete", "btn btn-small btn-danger"],
      ["Cancel", "cancel", "btn btn-small"]]) {
      const b = el("button", cls, label);
      b.type = "button";
      b.dataset.action = action;
      box.appendChild(b);
    }
    item.replaceChildren(box);
    box.querySelector("[data-action=confirm-delete]").focus();
  } else if (target.dataset.action === "confirm-delete") {
    try {
      await api("DELETE", "/api/presets/" + encodeURIComponent(preset.id));
      if (state.current && state.current.preset_id === preset.id) state.current.preset_id = null;
      await loadPresets();
      if (input("preset_id").value === "") showSources();
      flash($("preset-status"), "Deleted preset “" + preset.name + "”.");
    } catch (e) {
      $("preset-error").textContent = e.message;
      renderPresets();
    }
  } else if (target.dataset.action === "cancel") {
    renderPresets();
  }
}

/** Wire the panel's forms (once, at start). */
export function bindSettings() {
  ui.settingsForm.addEventListener("submit", saveSettings);
  ui.settingsForm.addEventListener("input", (event) => {
    clearStatus(ui.settingsStatus);
    const box = $("err-" + event.target.name);
    if (box) box.textContent = "";
    event.target.removeAttribute("aria-invalid");
    showSources();
  });
  document.addEventListener("chat-model-change", showSources);
  $("preset-form").addEventListener("submit", savePreset);
  $("default-preset").addEventListener("change", setDefaultPreset);
  $("preset-list").addEventListener("click", onPresetListClick);
}
