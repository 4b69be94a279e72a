// The message the server has not accepted yet. It goes out at once over an open socket; while the server cannot be
// reached it waits on the page as one pending bubble (the composer is emptied, Cancel gives the text back) and goes
// out once the socket is back. Nothing is sent twice: a message whose fate is unknown (the socket dropped before the
// server's `start`) is looked for in the stored conversation before it is sent again.
import { autoGrow, messageNodes, refreshActions, scrollToBottom, setStreaming, updateEmptyState } from "./chat_render.js";
import { giveBackFiles, takeComposerFiles } from "./chat_attach.js";
import { state, ui } from "./chat_state.js";
import * as view from "./chat_view.js";
import { ClientFrame } from "./protocol.js";
import { watchLoading } from "./chat_models.js";

const WAITING_NOTE = "Not sent yet: the server cannot be reached. It goes out once the connection is back.";
export const DRAINING_NOTE = "Not sent yet: the server is shutting down. It goes out once the connection is back.";
const UNCERTAIN_NOTE = "The connection dropped as this was sent: it is checked, and sent if need be, once it is back.";

/** Show `text` (with the files attached in the composer, which leave it) as the user's pending message and send
 * it, now or once the socket is open; `extra`: more fields of the frame (`truncate`, the user's choice when the
 * history does not fit). */
export function queueMessage(text, extra) {
  const files = takeComposerFiles();
  const attached = files.length ? { attachments: files.map((f) => f.id) } : {};
  const frame = aboutReplyOnShow(Object.assign({ type: ClientFrame.MESSAGE, content: text }, attached, extra || {}));
  const node = view.userMessage({ content: text, attachments: files });
  node.classList.add("is-pending");
  ui.messages.appendChild(node);
  ui.input.value = "";
  autoGrow();
  state.outbox = { frame, text, files, node, sent: false, uncertain: false, afterId: lastStoredId() };
  setStreaming(true);
  updateEmptyState();
  scrollToBottom(true);
  flushOutbox();
}

/** Send the waiting message if the socket is open; else say that it waits (not while a first connect is under way:
 * that takes milliseconds). */
export function flushOutbox() {
  const box = state.outbox;
  if (!box || box.sent || box.uncertain) return;
  box.sent = state.socket !== null && state.socket.send(box.frame);
  state.awaitingStart = box.sent;
  if (box.sent) watchLoading();
  const lost = state.socket === null || state.socket.attempt > 0;
  markWaiting(box.sent || !lost ? null : WAITING_NOTE);
}

/** The socket dropped: a message sent but not accepted yet may or may not have reached the server. */
export function outboxDropped() {
  const box = state.outbox;
  if (!box) return;
  if (box.sent) box.uncertain = true;
  box.sent = false;
  markWaiting(box.uncertain ? UNCERTAIN_NOTE : WAITING_NOTE);
}

/** The server refused the message for now (it is shutting down): it waits for the reconnect. */
export function outboxDeferred(note) {
  const box = state.outbox;
  if (!box) return;
  box.sent = false;
  state.awaitingStart = false;
  markWaiting(note);
}

/** After a reconnect, with the session as stored (null when it could not be read): a message that reached the
 * server leaves the outbox (its stored copy is on the page); one that did not goes out now. */
export function settleOutbox(session) {
  const box = state.outbox;
  if (!box) return;
  if (box.uncertain) {
    const arrived = session !== null && session.messages.some(
      (m) => m.role === "user" && m.id > box.afterId && m.content === box.text);
    if (arrived) {
      outboxAccepted();
      setStreaming(false);
      return;
    }
    // a server that still sets up or runs a reply may not have stored it yet: unknown still, it waits (Cancel)
    if (session === null || session.streaming) return;
    box.uncertain = false;
  }
  flushOutbox();
}

/** The server accepted the message (`start`): its stored copy replaces the pending one. */
export function outboxAccepted() {
  if (state.outbox) state.outbox.node.remove();
  state.outbox = null;
}

/** Take the waiting message back into the composer (a refusal, leaving the chat); false when there is none. */
export function giveBackOutbox() {
  const box = state.outbox;
  if (!box) return false;
  state.outbox = null;
  box.node.remove();
  ui.input.value = box.text;
  giveBackFiles(box.files);
  autoGrow();
  return true;
}

/** Cancel (the bubble's button, or Stop while the message waits): the text goes back to the composer. */
export function cancelOutbox() {
  if (!giveBackOutbox()) return;
  state.awaitingStart = false;
  setStreaming(false);
  updateEmptyState();
}

/** Re-attach the pending bubble after the conversation was drawn again. */
export function redrawOutbox() {
  if (!state.outbox) return;
  ui.messages.appendChild(state.outbox.node);
  updateEmptyState();
  refreshActions();
}

function markWaiting(note) {
  const box = state.outbox;
  ui.stop.textContent = note ? "Cancel" : "Stop";
  let line = box.node.querySelector(".msg-note");
  if (!note) {
    if (line) line.remove();
    return;
  }
  if (!line) {
    line = view.el("p", "msg-note");
    const cancel = view.el("button", "link-btn", "Cancel");
    cancel.type = "button";
    cancel.dataset.action = "cancel-send";
    cancel.addEventListener("click", cancelOutbox);
    line.append(view.el("span"), " ", cancel);
    box.node.insertBefore(line, box.node.querySelector(".msg-actions"));
  }
  line.firstChild.textContent = note;
}

/** A message answers the reply the page shows last (`parent_id`), not whatever branch another tab or device of
 * the same owner has put on show on the server since; with no reply on the page, the server's active leaf. */
function aboutReplyOnShow(frame) {
  const id = replyOnShowId();
  return id > 0 ? Object.assign(frame, { parent_id: id }) : frame;
}

/** The id of the reply the page shows last (0: none). */
export function replyOnShowId() {
  const last = messageNodes().pop();
  return last && last.dataset.role === "assistant" ? Number(last.dataset.id) || 0 : 0;
}

function lastStoredId() {
  return Math.max(0, ...messageNodes().map((n) => Number(n.dataset.id) || 0));
}
