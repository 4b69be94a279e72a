// The reply stream of the chat page: socket frames (start, deltas, done, errors), sending a message, Stop,
// Regenerate and edit-and-resend, and what to show after the socket drops and comes back.
(function () {
  "use strict";
  const ns = window.pagedchat;
  const { api, view } = ns;
  const c = ns.chat;
  const { state, ui } = c;
  const OPEN_TIMEOUT_MS = 5000;

  // ---- the socket --------------------------------------------------------------------------------------------
  function onOpen(isReconnect) {
    c.setConnStatus(null);
    if (isReconnect) reloadConversation();
  }

  function onDrop() {
    c.setConnStatus("Connection lost — reconnecting…");
    if (state.awaitingStart && state.pendingText !== null) ui.input.value = state.pendingText;
    if (state.assistantNode) {
      view.finishAssistant(state.assistantNode, { content: state.assistantText, status: "interrupted" });
    }
    state.assistantNode = null;
    state.awaitingStart = false;
    if (state.streaming) c.setStreaming(false);
  }

  function onGone(message) {
    c.showError(message);
    state.sessions = state.sessions.filter((s) => !state.current || s.id !== state.current.id);
    c.showBlankChat();
  }

  /** After a reconnect: show the conversation as the server stored it (a cut reply gets a Regenerate button). */
  async function reloadConversation() {
    if (!state.current) return;
    const id = state.current.id;
    try {
      const data = await api("GET", "/api/sessions/" + encodeURIComponent(id));
      if (!state.current || state.current.id !== id || state.streaming) return;
      c.renderConversation(data.messages);
      if (data.streaming) c.waitForServerReply(id);
    } catch (e) {
      c.showError(e.message);
    }
  }

  function onFrame(frame) {
    switch (frame.type) {
      case "start": {
        state.awaitingStart = false;
        state.pendingText = null;
        ui.messages.querySelectorAll(".msg.is-pending").forEach((n) => n.remove());
        ui.messages.appendChild(view.userMessage(frame.user_message));
        c.updateEmptyState();
        c.scrollToBottom(true);
        break;
      }
      case "assistant_start": {
        const node = view.assistantMessage({ id: frame.message_id, content: "" });
        view.startStreaming(node);
        ui.messages.appendChild(node);
        state.assistantNode = node;
        state.assistantText = "";
        c.refreshActions();
        c.scrollToBottom(true);
        break;
      }
      case "delta":
        state.assistantText += frame.text;
        c.queueRender();
        break;
      case "done":
        onDone(frame.message);
        break;
      case "error":
        onErrorFrame(frame);
        break;
      default: // pong, stop_ack
        break;
    }
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
    c.updateEmptyState();
    c.setStreaming(false);
    c.scrollToBottom(false);
    if (message.status === "failed") c.showError(message.error || "The reply failed.");
    c.refreshSessions().catch(() => {});
  }

  function onErrorFrame(frame) {
    c.showError(frame.message || "The server reported an error.");
    if (!state.awaitingStart) return;
    state.awaitingStart = false;
    ui.messages.querySelectorAll(".msg.is-pending").forEach((n) => n.remove());
    if (state.pendingText !== null) {
      ui.input.value = state.pendingText;
      c.autoGrow();
    }
    state.pendingText = null;
    c.setStreaming(false);
    reloadConversation();
  }

  // ---- turns -----------------------------------------------------------------------------------------------
  async function beginTurn(frame, giveBack) {
    c.clearError();
    c.setStreaming(true);
    state.awaitingStart = true;
    state.pendingText = giveBack;
    if (frame.type === "message") {
      const pending = view.userMessage({ content: frame.content });
      pending.classList.add("is-pending");
      ui.messages.appendChild(pending);
      ui.input.value = "";
      c.autoGrow();
    } else {
      const nodes = c.messageNodes();
      const lastUser = nodes.map((n) => n.dataset.role).lastIndexOf("user");
      nodes.slice(Math.max(lastUser, 0)).forEach((n) => n.remove());
    }
    c.updateEmptyState();
    c.scrollToBottom(true);
    const socket = state.socket;
    const open = socket ? await socket.waitOpen(OPEN_TIMEOUT_MS) : false;
    if (!open || !socket.send(frame)) {
      onErrorFrame({ message: "Not connected to the server: nothing was sent. Try again in a moment." });
    }
  }

  async function submitMessage() {
    const text = ui.input.value;
    if (!text.trim() || state.streaming) return;
    try {
      await c.ensureSession(text);
    } catch (e) {
      c.showError(e.message);
      return;
    }
    await beginTurn({ type: "message", content: text }, text);
  }

  function stopReply() {
    if (!state.streaming) return;
    ui.stop.disabled = true;
    ui.stop.textContent = "Stopping…";
    if (!state.socket || !state.socket.send({ type: "stop" })) {
      api("POST", "/api/sessions/" + encodeURIComponent(state.current.id) + "/stop").catch((e) => c.showError(e.message));
    }
  }

  function startEdit(node) {
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
      c.refreshActions();
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
      beginTurn({ type: "edit", content: area.value }, null);
    });
    area.focus();
  }

  Object.assign(c, { onOpen, onDrop, onGone, onFrame, reloadConversation, beginTurn, submitMessage, stopReply, startEdit });
})();
