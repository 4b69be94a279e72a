// What the chat page shows, drawn from its state: the message list, the sidebar, the header, the composer's busy
// state, the error banner, the connection line and the settings form.
import { DEFAULT_TITLE, SETTING_FIELDS, state, ui } from "./chat_state.js";
import * as view from "./chat_view.js";
import { FinishReason, ReplyStatus } from "./protocol.js";

export function showError(message) {
  ui.errorText.textContent = message;
  ui.errorBanner.hidden = false;
}

export function clearError() {
  ui.errorBanner.hidden = true;
  ui.errorText.textContent = "";
}

export function setConnStatus(text) {
  ui.connStatus.textContent = text || "";
  ui.connStatus.hidden = !text;
}

export function autoGrow() {
  ui.input.style.height = "auto";
  ui.input.style.height = Math.min(ui.input.scrollHeight, 220) + "px";
}

export function nearBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 120;
}

export function scrollToBottom(force) {
  if (force || nearBottom()) ui.messages.scrollTop = ui.messages.scrollHeight;
}

export function messageNodes() {
  return Array.from(ui.messages.querySelectorAll(".msg"));
}

export function updateEmptyState() {
  ui.empty.hidden = messageNodes().length > 0;
}

export function setStreaming(on) {
  state.streaming = on;
  ui.input.disabled = on;
  ui.send.hidden = on;
  ui.stop.hidden = !on;
  ui.stop.disabled = false;
  ui.stop.textContent = "Stop";
  ui.composer.classList.toggle("is-busy", on);
  refreshActions();
  if (on) ui.stop.focus();
  else if (!ui.settingsPanel.contains(document.activeElement)) ui.input.focus();
}

/** Edit on every user message and Regenerate on every reply (each starts a branch there); Continue on the last
reply when it stopped at its token limit; none of them, and no switching of versions, while a reply streams. */
export function refreshActions() {
  const nodes = messageNodes();
  const last = nodes[nodes.length - 1];
  for (const b of ui.messages.querySelectorAll("[data-action=edit], [data-action=regenerate]")) {
    b.hidden = state.streaming;
  }
  for (const b of ui.messages.querySelectorAll("[data-action=continue]")) {
    const node = b.closest(".msg");
    b.hidden = state.streaming || node !== last || node.dataset.status !== ReplyStatus.FINISHED ||
      node.dataset.finishReason !== FinishReason.LENGTH;
  }
  for (const nav of ui.messages.querySelectorAll(".msg-versions")) nav.classList.toggle("is-locked", state.streaming);
}

export function renderConversation(messages) {
  ui.messages.querySelectorAll(".msg").forEach((n) => n.remove());
  for (const m of messages) {
    ui.messages.appendChild(m.role === "user" ? view.userMessage(m) : view.assistantMessage(m));
  }
  updateEmptyState();
  refreshActions();
  scrollToBottom(true);
}

export function renderSidebar() {
  const items = state.sessions.map((s) => view.sessionItem(s, state.current !== null && s.id === state.current.id));
  if (!items.length) items.push(view.el("li", "session-none", "No chats yet"));
  ui.sessionList.replaceChildren(...items);
}

export function renderHeader() {
  ui.title.textContent = state.current ? state.current.title || "Untitled chat" : DEFAULT_TITLE;
  document.title = (state.current ? state.current.title + " · " : "") + "pagedchat";
}

/** Show the streamed text at the next frame: many deltas, one Markdown render. */
export function queueRender() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    if (!state.assistantNode) return;
    const stick = nearBottom();
    view.setAssistantText(state.assistantNode, state.assistantText);
    scrollToBottom(stick);
  });
}

/** The settings panel shows the open session's system prompt and sampling settings. */
export function fillSettings() {
  const form = ui.settingsForm;
  const session = state.current;
  const settings = (session && session.settings) || {};
  form.elements.system_prompt.value = session ? session.system_prompt || "" : "";
  for (const name of SETTING_FIELDS) form.elements[name].value = settings[name] != null ? settings[name] : "";
  ui.settingsError.textContent = "";
  ui.settingsStatus.textContent = "";
}
