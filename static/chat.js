// The chat page's state, rendering and sessions (sidebar, open session, its socket). chat_stream.js handles the
// reply stream itself: socket frames, sending, stop, regenerate and edit.
(function () {
  "use strict";
  const ns = window.pagedchat;
  const { api, ChatSocket, view } = ns;
  const DEFAULT_TITLE = "New chat";
  const SETTING_FIELDS = ["temperature", "top_p", "max_tokens"];
  const state = {
    sessions: [],
    current: null, // the open session, as the API returns it
    socket: null,
    streaming: false, // a reply of ours is being generated (or its request is on its way)
    awaitingStart: false, // a frame was sent and the server has not yet accepted it with `start`
    pendingText: null, // what to give back to the composer if the server refuses the message
    assistantNode: null,
    assistantText: "",
    renderQueued: false,
  };
  const ui = {};

  // ---- small helpers ---------------------------------------------------------------------------------------
  function showError(message) {
    ui.errorText.textContent = message;
    ui.errorBanner.hidden = false;
  }

  function clearError() {
    ui.errorBanner.hidden = true;
    ui.errorText.textContent = "";
  }

  function setConnStatus(text) {
    ui.connStatus.textContent = text || "";
    ui.connStatus.hidden = !text;
  }

  function titleFrom(text) {
    const line = text.trim().split("\n")[0].replace(/\s+/g, " ");
    return line.length > 48 ? line.slice(0, 47) + "…" : line || DEFAULT_TITLE;
  }

  function autoGrow() {
    ui.input.style.height = "auto";
    ui.input.style.height = Math.min(ui.input.scrollHeight, 220) + "px";
  }

  function nearBottom() {
    const m = ui.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 120;
  }

  function scrollToBottom(force) {
    if (force || nearBottom()) ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function messageNodes() {
    return Array.from(ui.messages.querySelectorAll(".msg"));
  }

  function updateEmptyState() {
    ui.empty.hidden = messageNodes().length > 0;
  }

  function setStreaming(on) {
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

  /** Edit only on the last user message, Regenerate only on the last reply, neither while a reply streams. */
  function refreshActions() {
    const nodes = messageNodes();
    const lastUser = nodes.filter((n) => n.dataset.role === "user").pop();
    const last = nodes[nodes.length - 1];
    for (const b of ui.messages.querySelectorAll("[data-action=edit]")) {
      b.hidden = state.streaming || b.closest(".msg") !== lastUser;
    }
    for (const b of ui.messages.querySelectorAll("[data-action=regenerate]")) {
      b.hidden = state.streaming || b.closest(".msg") !== last;
    }
  }

  // ---- rendering -------------------------------------------------------------------------------------------
  function renderConversation(messages) {
    ui.messages.querySelectorAll(".msg").forEach((n) => n.remove());
    for (const m of messages) {
      ui.messages.appendChild(m.role === "user" ? view.userMessage(m) : view.assistantMessage(m));
    }
    updateEmptyState();
    refreshActions();
    scrollToBottom(true);
  }

  function renderSidebar() {
    const items = state.sessions.map((s) => view.sessionItem(s, state.current !== null && s.id === state.current.id));
    if (!items.length) items.push(view.el("li", "session-none", "No chats yet"));
    ui.sessionList.replaceChildren(...items);
  }

  function renderHeader() {
    ui.title.textContent = state.current ? state.current.title || "Untitled chat" : DEFAULT_TITLE;
    document.title = (state.current ? state.current.title + " · " : "") + "pagedchat";
  }

  function queueRender() {
    if (state.renderQueued) return;
    state.renderQueued = true;
    requestAnimationFrame(() => {
      state.renderQueued = false;
      if (!state.assistantNode) return;
      const stick = nearBottom();
      view.setAssistantText(state.assistantNode, state.assistantText);
      scrollToBottom(stick);
    });
  }

  /** The settings panel shows the open session's system prompt and sampling settings. */
  function fillSettings() {
    const form = ui.settingsForm;
    const session = state.current;
    const settings = (session && session.settings) || {};
    form.elements.system_prompt.value = session ? session.system_prompt || "" : "";
    for (const name of SETTING_FIELDS) form.elements[name].value = settings[name] != null ? settings[name] : "";
    ui.settingsError.textContent = "";
    ui.settingsStatus.textContent = "";
  }

  // ---- sessions --------------------------------------------------------------------------------------------
  async function refreshSessions() {
    const data = await api("GET", "/api/sessions");
    state.sessions = data.sessions;
    renderSidebar();
  }

  function closeSocket() {
    if (state.socket) state.socket.close();
    state.socket = null;
    state.assistantNode = null;
    state.awaitingStart = false;
    if (state.streaming) setStreaming(false);
  }

  function showBlankChat() {
    closeSocket();
    state.current = null;
    history.replaceState(null, "", location.pathname);
    renderConversation([]);
    renderHeader();
    renderSidebar();
    fillSettings();
  }

  async function openSession(id) {
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
    const c = ns.chat; // the stream handlers live in chat_stream.js
    state.socket = new ChatSocket(id, { frame: c.onFrame, open: c.onOpen, drop: c.onDrop, gone: c.onGone });
    state.socket.connect();
    if (data.streaming) waitForServerReply(id);
  }

  /** Another connection's reply is still running here: show the stored text until it has ended. */
  async function waitForServerReply(id) {
    setConnStatus("A reply is still being written…");
    for (let i = 0; i < 60 && state.current && state.current.id === id; i++) {
      await new Promise((r) => setTimeout(r, 500));
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

  async function ensureSession(text) {
    if (state.current) {
      if (state.current.title === DEFAULT_TITLE && !messageNodes().length) renameSession(state.current.id, titleFrom(text));
      return;
    }
    const session = await api("POST", "/api/sessions", { title: titleFrom(text) });
    state.sessions.unshift(session);
    await openSession(session.id);
  }

  async function renameSession(id, title) {
    try {
      const updated = await api("PATCH", "/api/sessions/" + encodeURIComponent(id), { title });
      state.sessions = state.sessions.map((s) => (s.id === id ? updated : s));
      if (state.current && state.current.id === id) Object.assign(state.current, { title: updated.title });
      renderHeader();
    } catch (e) {
      showError(e.message);
    }
    renderSidebar();
  }

  async function deleteSession(id) {
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

  ns.chat = {
    state, ui, DEFAULT_TITLE, SETTING_FIELDS, showError, clearError, setConnStatus, titleFrom, autoGrow, nearBottom,
    scrollToBottom, messageNodes, updateEmptyState, setStreaming, refreshActions, renderConversation, renderSidebar,
    queueRender, fillSettings, refreshSessions, closeSocket, showBlankChat, openSession, waitForServerReply,
    ensureSession, renameSession, deleteSession,
  };
})();
