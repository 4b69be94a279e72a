// The reply stream of the open session: its socket and what each frame (start, deltas, done, errors) does to the
// page, and what to show after the socket drops and comes back.
import { ChatSocket } from "./chat_api.js";
import { CONTEXT_CODES, showContext } from "./chat_context.js";
import {
  DRAINING_NOTE, flushOutbox, giveBackOutbox, outboxAccepted, outboxDeferred, outboxDropped, settleOutbox,
} from "./chat_outbox.js";
import {
  clearConnectionError, queueRender, refreshActions, scrollToBottom, setConnStatus, setStreaming, showError,
  updateEmptyState,
} from "./chat_render.js";
import { state, ui } from "./chat_state.js";
import { CONNECTION_LOST, refreshSessions, reloadConversation, showBlankChat } from "./chat_sync.js";
import * as view from "./chat_view.js";
import { ReplyStatus, ServerFrame } from "./protocol.js";

// error codes of the server going away (app/http/services.py, app/chat/ws.py): the reconnect answers them
const SHUTTING_DOWN = "shutting_down";
const SERVER_SHUTDOWN = "server_shutdown";

/** Open the socket of session `id`; it reconnects on its own until closeSocket(). */
export function connectSocket(id) {
  state.socket = new ChatSocket(id, { frame: onFrame, open: onOpen, drop: onDrop, gone: onGone });
  state.socket.connect();
}

/** Open, or open again: after a reconnect the conversation is read again from the server (the page shows what was
 * stored, whatever it guessed meanwhile), then a message still waiting goes out (once). */
async function onOpen(isReconnect) {
  const socket = state.socket;
  setConnStatus(null);
  clearConnectionError();
  if (!isReconnect) {
    flushOutbox();
    return;
  }
  const session = await reloadConversation();
  if (state.socket === socket) settleOutbox(session);
}

function onDrop() {
  setConnStatus(CONNECTION_LOST);
  dropProgress();
  if (state.assistantNode) {
    // the server stores a reply whose socket dropped as interrupted, unless the user's Stop reached it first
    const status = state.stopRequested ? ReplyStatus.STOPPED : ReplyStatus.INTERRUPTED;
    view.finishAssistant(state.assistantNode, { content: state.assistantText, status });
  }
  state.assistantNode = null;
  state.awaitingStart = false;
  outboxDropped(); // a message not accepted yet waits for the reconnect: the composer stays busy with it
  if (state.streaming && !state.outbox) setStreaming(false);
}

function onGone(message) {
  showError(message);
  state.sessions = state.sessions.filter((s) => !state.current || s.id !== state.current.id);
  showBlankChat();
}

function onFrame(frame) {
  switch (frame.type) {
    case ServerFrame.START: {
      state.awaitingStart = false;
      outboxAccepted();
      // a regenerated or continued reply answers a message the page shows already
      if (!messageNode(frame.user_message.id)) ui.messages.appendChild(view.userMessage(frame.user_message));
      updateEmptyState();
      scrollToBottom(true);
      break;
    }
    case ServerFrame.PROGRESS:
      if (state.progressNode) {
        state.progressNode.querySelector(".msg-progress").textContent = view.progressText(frame);
      } else {
        state.progressNode = view.progressMessage(frame);
        ui.messages.appendChild(state.progressNode);
        scrollToBottom(true);
      }
      break;
    case ServerFrame.ASSISTANT_START: {
      dropProgress();
      // continuing, the reply's own bubble grows
      let node = frame.continues ? messageNode(frame.message_id) : null;
      if (!node) {
        node = view.assistantMessage({
          id: frame.message_id, content: "", sibling_ids: frame.sibling_ids, sibling_index: frame.sibling_index,
        });
        ui.messages.appendChild(node);
      }
      view.startStreaming(node);
      state.assistantNode = node;
      state.assistantText = node.dataset.text || "";
      refreshActions();
      scrollToBottom(true);
      break;
    }
    case ServerFrame.DELTA:
      state.assistantText += frame.text;
      queueRender();
      break;
    case ServerFrame.DONE:
      if (frame.dropped) onDropped();
      else onDone(frame.message);
      break;
    case ServerFrame.ERROR:
      onErrorFrame(frame);
      break;
    default: // PONG, STOP_ACK
      break;
  }
}

/** The reading bubble goes once the reply starts, ends or its connection drops. */
function dropProgress() {
  if (state.progressNode) state.progressNode.remove();
  state.progressNode = null;
}

function messageNode(id) {
  return id == null ? null : ui.messages.querySelector('.msg[data-id="' + Number(id) + '"]');
}

function onDone(message) {
  dropProgress();
  let node = state.assistantNode;
  if (!node) {
    node = view.assistantMessage({ content: "" });
    ui.messages.appendChild(node);
  }
  view.setAssistantText(node, message.content || "");
  view.finishAssistant(node, message);
  state.assistantNode = null;
  state.awaitingStart = false;
  updateEmptyState();
  setStreaming(false);
  scrollToBottom(false);
  if (message.status === ReplyStatus.FAILED) showError(message.error || "The reply failed.");
  refreshSessions().catch(() => {});
}

/** Stopped before its first token: the server kept no reply, and the page shows what it stored (the user message
 * last; a regenerated reply's old version back on show). */
function onDropped() {
  dropProgress();
  if (state.assistantNode) state.assistantNode.remove();
  state.assistantNode = null;
  state.awaitingStart = false;
  setStreaming(false);
  updateEmptyState();
  reloadConversation();
}

/** An error frame: a refused message goes back into the composer, one refused because the server is shutting down
 * waits for the reconnect; the server's goodbye is shown until the connection is back. */
function onErrorFrame(frame) {
  if (state.awaitingStart && state.outbox && frame.code === SHUTTING_DOWN) {
    outboxDeferred(DRAINING_NOTE);
    return;
  }
  if (state.awaitingStart && state.outbox && frame.context && CONTEXT_CODES.includes(frame.code)) {
    // the history grew or the settings changed since the check: the message goes back, with the choices
    state.awaitingStart = false;
    const text = state.outbox.text;
    giveBackOutbox();
    setStreaming(false);
    updateEmptyState();
    showContext(frame.context, text);
    return;
  }
  if (state.awaitingStart && !state.outbox && state.resendTurn && frame.context && CONTEXT_CODES.includes(frame.code)) {
    state.awaitingStart = false;
    setStreaming(false);
    reloadConversation(); // the turn's cut messages come back
    showContext(frame.context, null, state.resendTurn);
    return;
  }
  showError(frame.message || "The server reported an error.", frame.code === SERVER_SHUTDOWN ? "connection" : "");
  if (!state.awaitingStart) return;
  state.awaitingStart = false;
  giveBackOutbox();
  setStreaming(false);
  reloadConversation();
}
