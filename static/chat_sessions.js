// Which session is open, and the sidebar's changes to the list: open, create (from a first message), rename,
// delete.
import { api } from "./chat_api.js";
import {
  clearError, fillSettings, messageNodes, renderConversation, renderHeader, renderSidebar, showError,
} from "./chat_render.js";
import { DEFAULT_TITLE, state } from "./chat_state.js";
import { connectSocket } from "./chat_stream.js";
import { titleFrom } from "./chat_title.js";
import { closeSocket, showBlankChat, waitForServerReply } from "./chat_sync.js";

export async function openSession(id) {
  closeSocket();
  clearError();
  let data;
  try {
    data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status === 404) {
      state.sessions = state.sessions.filter((s) => s.id !== id);
      showBlankChat();
      return;
    }
    showError(e.message);
    return;
  }
  state.current = data;
  history.replaceState(null, "", "#s=" + encodeURIComponent(id));
  renderHeader();
  renderSidebar();
  renderConversation(data.messages);
  fillSettings();
  connectSocket(id);
  if (data.streaming) waitForServerReply(id);
}

/** Create and open a session titled `title`. */
export async function createSession(title) {
  const session = await api("POST", "/api/sessions", { title });
  state.sessions.unshift(session);
  await openSession(session.id);
}

/** Before the first message: a session to send it to, named after it. */
export async function ensureSession(text) {
  if (state.current) {
    const untitled = state.current.title === DEFAULT_TITLE && !messageNodes().length;
    if (untitled) renameSession(state.current.id, titleFrom(text) || DEFAULT_TITLE);
    return;
  }
  await createSession(titleFrom(text) || DEFAULT_TITLE);
}

export async function renameSession(id, title) {
  try {
    const updated = await api("PATCH", "/api/sessions/" + encodeURIComponent(id), { title });
    state.sessions = state.sessions.map((s) => (s.id === id ? updated : s));
    if (state.current && state.current.id === id) Object.assign(state.current, { title: updated.title });
    renderHeader();
  } catch (e) {
    showError(e.message, e.status === 0 ? "connection" : "");
  }
  renderSidebar();
}

export async function deleteSession(id) {
  try {
    await api("DELETE", "/api/sessions/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status !== 404) {
      showError(e.message);
      renderSidebar();
      return;
    }
  }
  state.sessions = state.sessions.filter((s) => s.id !== id);
  if (state.current && state.current.id === id) {
    if (state.sessions.length) await openSession(state.sessions[0].id);
    else showBlankChat();
  } else {
    renderSidebar();
  }
}
