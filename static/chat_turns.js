// Starting and ending replies: send a message, Stop, Regenerate a reply, edit-and-resend a message.
import { api } from "./chat_api.js";
import {
  autoGrow, clearError, messageNodes, refreshActions, scrollToBottom, setStreaming, showError, updateEmptyState,
} from "./chat_render.js";
import { ensureSession } from "./chat_sessions.js";
import { state, ui } from "./chat_state.js";
import { onErrorFrame } from "./chat_stream.js";
import * as view from "./chat_view.js";
import { ClientFrame } from "./protocol.js";

const OPEN_TIMEOUT_MS = 5000;

/** A turn frame naming the message of `node` (without an id the server takes the branch on show). */
export function aboutNode(frame, node) {
  return node && node.dataset.id ? Object.assign(frame, { message_id: Number(node.dataset.id) }) : frame;
}

/** Send a reply frame (MESSAGE, REGENERATE, EDIT or CONTINUE); `giveBack` returns to the composer if it is
refused; `cutFrom` (a message node) and everything after it leave the page until the server sends the new branch. */
export async function beginTurn(frame, giveBack, cutFrom) {
  clearError();
  setStreaming(true);
  state.awaitingStart = true;
  state.pendingText = giveBack;
  if (frame.type === ClientFrame.MESSAGE) {
    const pending = view.userMessage({ content: frame.content });
    pending.classList.add("is-pending");
    ui.messages.appendChild(pending);
    ui.input.value = "";
    autoGrow();
  } else if (cutFrom) {
    // REGENERATE and EDIT start a branch at `cutFrom`: the old one stays on the server as the other version
    const nodes = messageNodes();
    nodes.slice(nodes.indexOf(cutFrom)).forEach((n) => n.remove());
  }
  updateEmptyState();
  scrollToBottom(true);
  const socket = state.socket;
  const open = socket ? await socket.waitOpen(OPEN_TIMEOUT_MS) : false;
  if (!open || !socket.send(frame)) {
    onErrorFrame({ message: "Not connected to the server: nothing was sent. Try again in a moment." });
  }
}

export async function submitMessage() {
  const text = ui.input.value;
  if (!text.trim() || state.streaming) return;
  try {
    await ensureSession(text);
  } catch (e) {
    showError(e.message);
    return;
  }
  await beginTurn({ type: ClientFrame.MESSAGE, content: text }, text);
}

/** A new version of the reply `node`, beside it. */
export function regenerateReply(node) {
  return beginTurn(aboutNode({ type: ClientFrame.REGENERATE }, node), null, node);
}

export function stopReply() {
  if (!state.streaming) return;
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
    beginTurn(aboutNode({ type: ClientFrame.EDIT, content: area.value }, node), null, node);
  });
  area.focus();
}
