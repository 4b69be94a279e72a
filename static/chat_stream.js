// The reply stream of the open session: its socket and what each frame (start, deltas, done, errors) does to the
// page, and what to show after the socket drops and comes back.
import { ChatSocket } from "./chat_api.js";
import {
  autoGrow, queueRender, refreshActions, scrollToBottom, setConnStatus, setStreaming, showError, updateEmptyState,
} from "./chat_render.js";
import { state, ui } from "./chat_state.js";
import { refreshSessions, reloadConversation, showBlankChat } from "./chat_sync.js";
import * as view from "./chat_view.js";
import { ReplyStatus, ServerFrame } from "./protocol.js";

/** Open the socket of session `id`; it reconnects on its own until closeSocket(). */
export function connectSocket(id) {
  state.socket = new ChatSocket(id, { frame: onFrame, open: onOpen, drop: onDrop, gone: onGone });
  state.socket.connect();
}

function onOpen(isReconnect) {
  setConnStatus(null);
  if (isReconnect) reloadConversation();
}

function onDrop() {
  setConnStatus("Connection lost — reconnecting…");
  if (state.awaitingStart && state.pendingText !== null) ui.input.value = state.pendingText;
  if (state.assistantNode) {
    view.finishAssistant(state.assistantNode, { content: state.assistantText, status: ReplyStatus.INTERRUPTED });
  }
  state.assistantNode = null;
  state.awaitingStart = false;
  if (state.streaming) setStreaming(false);
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
      state.pendingText = null;
      ui.messages.querySelectorAll(".msg.is-pending").forEach((n) => n.remove());
      // a regenerated or continued reply answers a message the page shows already
      if (!messageNode(frame.user_message.id)) ui.messages.appendChild(view.userMessage(frame.user_message));
      updateEmptyState();
      scrollToBottom(true);
      break;
    }
    case ServerFrame.ASSISTANT_START: {
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
      onDone(frame.message);
      break;
    case ServerFrame.ERROR:
      onErrorFrame(frame);
      break;
    default: // PONG, STOP_ACK
      break;
  }
}

function messageNode(id) {
  return id == null ? null : ui.messages.querySelector('.msg[data-id="' + Number(id) + '"]');
}

function onDone(message) {
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

/** An error frame, or a frame that could not be sent: a refused message goes back into the composer. */
export function onErrorFrame(frame) {
  showError(frame.message || "The server reported an error.");
  if (!state.awaitingStart) return;
  state.awaitingStart = false;
  ui.messages.querySelectorAll(".msg.is-pending").forEach((n) => n.remove());
  if (state.pendingText !== null) {
    ui.input.value = state.pendingText;
    autoGrow();
  }
  state.pendingText = null;
  setStreaming(false);
  reloadConversation();
}
