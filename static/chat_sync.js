// Keeping the page in step with the server's copy: the session list, the blank chat, and re-reading the open
// conversation after a reconnect or while another connection's reply is still running.
import { api } from "./chat_api.js";
import { state } from "./chat_state.js";
import {
  fillSettings, renderConversation, renderHeader, renderSidebar, setConnStatus, setStreaming, showError,
} from "./chat_render.js";

const SERVER_REPLY_POLL_MS = 500;
const SERVER_REPLY_MAX_POLLS = 60;

export async function refreshSessions() {
  const data = await api("GET", "/api/sessions");
  state.sessions = data.sessions;
  renderSidebar();
}

export function closeSocket() {
  if (state.socket) state.socket.close();
  state.socket = null;
  state.assistantNode = null;
  state.awaitingStart = false;
  if (state.streaming) setStreaming(false);
}

export function showBlankChat() {
  closeSocket();
  state.current = null;
  history.replaceState(null, "", location.pathname);
  renderConversation([]);
  renderHeader();
  renderSidebar();
  fillSettings();
}

/** Another connection's reply is still running here: show the stored text until it has ended. */
export async function waitForServerReply(id) {
  setConnStatus("A reply is still being written…");
  for (let i = 0; i < SERVER_REPLY_MAX_POLLS && state.current && state.current.id === id; i++) {
    await new Promise((r) => setTimeout(r, SERVER_REPLY_POLL_MS));
    let data;
    try {
      data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
    } catch (e) {
      break;
    }
    if (!state.current || state.current.id !== id || state.streaming) return;
    renderConversation(data.messages);
    if (!data.streaming) break;
  }
  setConnStatus(state.socket && state.socket.isOpen ? null : "Connecting…");
}

/** After a reconnect: show the conversation as the server stored it (a cut reply gets a Regenerate button). */
export async function reloadConversation() {
  if (!state.current) return;
  const id = state.current.id;
  try {
    const data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
    if (!state.current || state.current.id !== id || state.streaming) return;
    renderConversation(data.messages);
    if (data.streaming) waitForServerReply(id);
  } catch (e) {
    showError(e.message);
  }
}
