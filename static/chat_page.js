// The chat page's wiring: keyboard and click handlers, the sidebar's rename/delete, the settings panel.
(function () {
  "use strict";
  const ns = window.pagedchat;
  const chat = ns.chat;
  const { state, ui } = chat;
  const SETTING_FIELDS = chat.SETTING_FIELDS;

  function bindElements() {
    const ids = {
      app: "app", sidebar: "sidebar", scrim: "scrim", sessionList: "session-list", newChat: "new-chat",
      toggleSidebar: "toggle-sidebar", title: "chat-title", connStatus: "conn-status", messages: "messages",
      empty: "empty-state", composer: "composer", input: "input", send: "send", stop: "stop",
      errorBanner: "error-banner", errorText: "error-text", errorClose: "error-close",
      toggleSettings: "toggle-settings", settingsPanel: "settings-panel", settingsForm: "settings-form",
      settingsError: "settings-error", settingsStatus: "settings-status", settingsClose: "settings-close",
    };
    for (const [key, id] of Object.entries(ids)) ui[key] = document.getElementById(id);
  }

  // ---- sidebar -----------------------------------------------------------------------------------------------
  function setSidebarOpen(open) {
    ui.app.classList.toggle("sidebar-open", open);
    ui.scrim.hidden = !open;
    ui.toggleSidebar.setAttribute("aria-expanded", String(open));
    if (open) ui.newChat.focus();
  }

  function onSidebarClick(event) {
    const target = event.target.closest("[data-action]");
    const item = event.target.closest("li.session");
    if (!target || !item) return;
    const session = state.sessions.find((s) => s.id === item.dataset.id);
    if (!session) return;
    const action = target.dataset.action;
    if (action === "open") {
      setSidebarOpen(false);
      if (!state.current || state.current.id !== session.id) chat.openSession(session.id);
    } else if (action === "rename") {
      const form = ns.view.renameForm(session);
      item.replaceChildren(form);
      const input = form.querySelector("input");
      input.focus();
      input.select();
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        const title = input.value.trim();
        if (title) chat.renameSession(session.id, title);
        else chat.refreshSessions();
      });
      input.addEventListener("keydown", (e) => {
        if (e.key === "Escape") chat.refreshSessions();
      });
    } else if (action === "delete") {
      const box = ns.view.deleteConfirm(session);
      item.replaceChildren(box);
      box.querySelector("[data-action=confirm-delete]").focus();
    } else if (action === "confirm-delete") {
      chat.deleteSession(session.id);
    } else if (action === "cancel") {
      chat.refreshSessions().catch((e) => chat.showError(e.message));
    }
  }

  // ---- messages ----------------------------------------------------------------------------------------------
  function onMessagesClick(event) {
    const target = event.target.closest("[data-action]");
    if (!target) return;
    const node = target.closest(".msg");
    const action = target.dataset.action;
    if (action === "regenerate" && !state.streaming) {
      chat.beginTurn({ type: "regenerate" }, null);
    } else if (action === "edit" && !state.streaming) {
      chat.startEdit(node);
    } else if (action === "copy") {
      navigator.clipboard.writeText(node.dataset.text || "").then(
        () => {
          target.textContent = "Copied";
          setTimeout(() => (target.textContent = "Copy"), 1500);
        },
        () => chat.showError("The browser did not allow copying to the clipboard."),
      );
    }
  }

  // ---- settings ----------------------------------------------------------------------------------------------
  function setSettingsOpen(open) {
    ui.settingsPanel.hidden = !open;
    ui.app.classList.toggle("settings-open", open);
    ui.toggleSettings.setAttribute("aria-expanded", String(open));
    if (open) {
      chat.fillSettings();
      ui.settingsForm.elements.system_prompt.focus();
    } else {
      ui.toggleSettings.focus();
    }
  }

  async function saveSettings(event) {
    event.preventDefault();
    const form = ui.settingsForm;
    ui.settingsError.textContent = "";
    ui.settingsStatus.textContent = "";
    const settings = Object.assign({}, (state.current && state.current.settings) || {});
    for (const name of SETTING_FIELDS) {
      const raw = form.elements[name].value.trim();
      delete settings[name];
      if (raw === "") continue;
      const value = Number(raw);
      if (!Number.isFinite(value)) {
        ui.settingsError.textContent = name + " must be a number.";
        return;
      }
      settings[name] = name === "max_tokens" ? Math.round(value) : value;
    }
    const systemPrompt = form.elements.system_prompt.value; // read before openSession() refills the form
    try {
      if (!state.current) {
        const created = await ns.api("POST", "/api/sessions", { title: chat.DEFAULT_TITLE });
        state.sessions.unshift(created);
        await chat.openSession(created.id);
      }
      const updated = await ns.api("PATCH", "/api/sessions/" + encodeURIComponent(state.current.id), {
        system_prompt: systemPrompt,
        settings,
      });
      Object.assign(state.current, updated);
      chat.fillSettings();
      ui.settingsStatus.textContent = "Saved.";
    } catch (e) {
      ui.settingsError.textContent = e.message;
    }
  }

  // ---- start -------------------------------------------------------------------------------------------------
  function bindEvents() {
    ui.composer.addEventListener("submit", (e) => {
      e.preventDefault();
      chat.submitMessage();
    });
    ui.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.altKey && !e.ctrlKey && !e.metaKey && !e.isComposing) {
        e.preventDefault();
        chat.submitMessage();
      }
    });
    ui.input.addEventListener("input", () => {
      ui.input.style.height = "auto";
      ui.input.style.height = Math.min(ui.input.scrollHeight, 220) + "px";
    });
    ui.stop.addEventListener("click", chat.stopReply);
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape") return;
      if (state.streaming) chat.stopReply();
      else if (!ui.settingsPanel.hidden) setSettingsOpen(false);
      else if (ui.app.classList.contains("sidebar-open")) setSidebarOpen(false);
    });
    ui.newChat.addEventListener("click", () => {
      setSidebarOpen(false);
      chat.showBlankChat();
      ui.input.focus();
    });
    ui.toggleSidebar.addEventListener("click", () => setSidebarOpen(!ui.app.classList.contains("sidebar-open")));
    ui.scrim.addEventListener("click", () => setSidebarOpen(false));
    ui.sessionList.addEventListener("click", onSidebarClick);
    ui.messages.addEventListener("click", onMessagesClick);
    ui.errorClose.addEventListener("click", chat.clearError);
    ui.toggleSettings.addEventListener("click", () => setSettingsOpen(ui.settingsPanel.hidden));
    ui.settingsClose.addEventListener("click", () => setSettingsOpen(false));
    ui.settingsForm.addEventListener("submit", saveSettings);
    window.addEventListener("hashchange", () => {
      const id = new URLSearchParams(location.hash.slice(1)).get("s");
      if (id && (!state.current || state.current.id !== id)) chat.openSession(id);
    });
  }

  async function start() {
    bindElements();
    bindEvents();
    try {
      await chat.refreshSessions();
    } catch (e) {
      chat.showError(e.message);
    }
    const wanted = new URLSearchParams(location.hash.slice(1)).get("s");
    const target = state.sessions.find((s) => s.id === wanted) || state.sessions[0];
    if (target) await chat.openSession(target.id);
    else chat.showBlankChat();
    document.body.dataset.ready = "true";
    ui.input.focus();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
