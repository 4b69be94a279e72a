// Keeping the page in step with the server's copy: the session list, the blank chat, and re-reading the open
// conversation after a reconnect or while another connection's reply is still running.
import { api } from "./chat_api.js";
import { loadComposerFiles } from "./chat_attach.js";
import { giveBackOutbox, redrawOutbox } from "./chat_outbox.js";
import { state } from "./chat_state.js";
import {
  fillSettings, renderConversation, renderHeader, renderSidebar, setConnStatus, setStreaming, showError,
} from "./chat_render.js";

const SERVER_REPLY_POLL_MS = 500;
const SERVER_REPLY_MAX_POLLS = 60;
export const CONNECTION_LOST = "Connection lost — reconnecting…";

export async function refreshSessions() {
  const data = await api("GET", "/api/sessions");
  state.sessions = data.sessions;
  renderSidebar();
}

/** Leave the open session's socket: a message still waiting goes back to the composer, and a chat without a
 * socket has no connection to report. */
export function closeSocket() {
  if (state.socket) state.socket.close();
  state.socket = null;
  state.assistantNode = null;
  state.awaitingStart = false;
  giveBackOutbox();
  setConnStatus(null);
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
  loadComposerFiles(null);
}

/** Another connection's reply is still running here: show the stored text until it has ended; the session as last
 * read (null when none was). */
export async function waitForServerReply(id) {
  const here = () => state.current !== null && state.current.id === id;
  let last = null;
  setConnStatus("A reply is still being written…");
  for (let i = 0; i < SERVER_REPLY_MAX_POLLS && here() && !ownReplyOnItsWay(); i++) {
    await new Promise((r) => setTimeout(r, SERVER_REPLY_POLL_MS));
    let data;
    try {
      data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
    } catch (e) {
      break;
    }
    if (!here() || ownReplyOnItsWay()) break;
    last = data;
    renderConversation(data.messages);
    redrawOutbox();
    if (!data.streaming) break;
  }
  // the status line is the open socket's: left to it once this chat is no longer on the page
  if (here()) setConnStatus(socketStatus());
  return last;
}

/** The status line of the open session's socket: nothing while it is open. */
function socketStatus() {
  const socket = state.socket;
  if (!socket || socket.isOpen) return null;
  return socket.attempt > 0 ? CONNECTION_LOST : "Connecting…";
}

/** After a reconnect: show the conversation as the server stored it (a cut reply gets a Regenerate button), with a
 * message that still waits to go out after it; a reply still running there is followed to its end. Resolves to the
 * session as last read (null when it was not drawn). */
export async function reloadConversation() {
  if (!state.current) return null;
  const id = state.current.id;
  try {
    const data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
    if (!state.current || state.current.id !== id || ownReplyOnItsWay()) return null;
    renderConversation(data.messages);
    redrawOutbox();
    return data.streaming ? (await waitForServerReply(id)) || data : data;
  } catch (e) {
    showError(e.message, e.status === 0 ? "connection" : "");
    return null;
  }
}

/** A reply of ours is streaming or its frame is with the server (a message waiting in the outbox is not). */
function ownReplyOnItsWay() {
  return state.streaming && !(state.outbox && !state.outbox.sent);
}
