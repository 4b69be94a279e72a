// What the chat page shows, drawn from its state: the message list, the sidebar, the header, the composer's busy
// state, the error banner, the connection line and the settings form.
import { DEFAULT_TITLE, state, ui } from "./chat_state.js";
import * as view from "./chat_view.js";
import { FinishReason, ReplyStatus } from "./protocol.js";

const STREAM_RENDER_MS = 50;

/** Show an error; `cause` "connection" marks one that a reconnect makes moot (it is cleared then). */
export function showError(message, cause) {
  ui.errorText.textContent = message;
  ui.errorBanner.dataset.cause = cause || "";
  ui.errorBanner.hidden = false;
}

export function clearError() {
  ui.errorBanner.hidden = true;
  ui.errorText.textContent = "";
}

/** The connection is back: an error that only said it was not there goes. */
export function clearConnectionError() {
  if (ui.errorBanner.dataset.cause === "connection") clearError();
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

/** Show the streamed text at a next frame, at most every STREAM_RENDER_MS: many deltas, one render of the
 *  reply's open block. */
export function queueRender() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  const wait = Math.max(0, state.lastRenderAt + STREAM_RENDER_MS - performance.now());
  setTimeout(() => requestAnimationFrame(() => {
    state.renderQueued = false;
    state.lastRenderAt = performance.now();
    if (!state.assistantNode) return;
    const stick = nearBottom();
    view.streamAssistantText(state.assistantNode, state.assistantText);
    scrollToBottom(stick);
  }), wait);
}

// the settings panel's filling lives with the rest of the panel
export { fillSettings } from "./chat_settings.js";
