// Starting and ending replies: send a message, Stop, Regenerate a reply, edit-and-resend a message.
import { api } from "./chat_api.js";
import { uploading } from "./chat_attach.js";
import { clearContextNotice, sendPlanned } from "./chat_context.js";
import { watchLoading } from "./chat_models.js";
import { cancelOutbox } from "./chat_outbox.js";
import {
  clearError, messageNodes, refreshActions, scrollToBottom, setStreaming, showError, updateEmptyState,
} from "./chat_render.js";
import { ensureSession } from "./chat_sessions.js";
import { state, ui } from "./chat_state.js";
import * as view from "./chat_view.js";
import { ClientFrame } from "./protocol.js";

const NOT_CONNECTED = "Not connected to the server: nothing was changed. Try again once the connection is back.";

/** A turn frame naming the message of `node` (without an id the server takes the branch on show). */
export function aboutNode(frame, node) {
  return node && node.dataset.id ? Object.assign(frame, { message_id: Number(node.dataset.id) }) : frame;
}

/** Send what the composer holds once the server says it fits the context (else the composer says what to do):
 * it goes out now, or waits on the page until the server can be reached. */
export async function submitMessage() {
  const text = ui.input.value;
  if (!text.trim() || state.streaming) return;
  if (uploading()) {
    showError("A file is still being attached: send once its chip shows its tokens.");
    return;
  }
  try {
    await ensureSession(text);
  } catch (e) {
    showError(e.message, e.status === 0 ? "connection" : ""); // no chat to wait in: the text stays in the composer
    return;
  }
  clearError();
  clearContextNotice();
  state.stopRequested = false;
  await sendPlanned(text);
}

/** REGENERATE, EDIT or CONTINUE a message on the page. Only over an open socket: while the server cannot be reached
 * the page stays as it is and says so (false). `cutFrom` (a message node) and everything after it leave the page until
 * the server sends the new branch (the old one stays on the server as the other version). */
export function beginTurn(frame, cutFrom) {
  if (!state.socket || !state.socket.isOpen) {
    showError(NOT_CONNECTED, "connection");
    return false;
  }
  clearError();
  clearContextNotice();
  state.stopRequested = false;
  setStreaming(true);
  state.awaitingStart = true;
  // refused because the history no longer fits (409 context_full): the same turn again with the user's choice
  const cutId = cutFrom ? Number(cutFrom.dataset.id) : 0;
  state.resendTurn = (extra) => beginTurn(
    Object.assign({}, frame, extra), cutId ? ui.messages.querySelector('.msg[data-id="' + cutId + '"]') : null);
  if (cutFrom) {
    const nodes = messageNodes();
    nodes.slice(Math.max(nodes.indexOf(cutFrom), 0)).forEach((n) => n.remove());
  }
  updateEmptyState();
  scrollToBottom(true);
  state.socket.send(frame);
  watchLoading();
  return true;
}

/** A new version of the reply `node`, beside it. */
export function regenerateReply(node) {
  return beginTurn(aboutNode({ type: ClientFrame.REGENERATE }, node), node);
}

/** Stop the running reply; a message still waiting to go out is cancelled instead (its text back in the composer). */
export function stopReply() {
  if (!state.streaming) return;
  if (state.outbox && !state.outbox.sent) {
    cancelOutbox();
    return;
  }
  state.stopRequested = true;
  ui.stop.disabled = true;
  ui.stop.textContent = "Stopping…";
  if (!state.socket || !state.socket.send({ type: ClientFrame.STOP })) {
    api("POST", "/api/sessions/" + encodeURIComponent(state.current.id) + "/stop").catch((e) => showError(e.message));
  }
}

/** Turn a user message into a form; sending it adds a new version of the message (a branch there) and its reply. */
export function startEdit(node) {
  const body = node.querySelector(".msg-body");
  const original = body.textContent;
  const form = view.el("form", "msg-edit");
  const area = view.el("textarea");
  area.value = original;
  area.rows = Math.min(10, original.split("\n").length + 1);
  area.setAttribute("aria-label", "Edit your message");
  const send = view.el("button", "btn btn-small btn-primary", "Send");
  send.type = "submit";
  const cancel = view.el("button", "btn btn-small", "Cancel");
  cancel.type = "button";
  const row = view.el("div", "row");
  row.append(send, cancel);
  form.append(area, row);
  node.classList.add("is-editing");
  body.hidden = true;
  node.insertBefore(form, body);
  const close = () => {
    form.remove();
    body.hidden = false;
    node.classList.remove("is-editing");
    refreshActions();
  };
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", (e) => {
    if (e.key === "Escape") close();
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (!area.value.trim() || state.streaming) return;
    beginTurn(aboutNode({ type: ClientFrame.EDIT, content: area.value }, node), node); // refused offline: the form stays
  });
  area.focus();
}
