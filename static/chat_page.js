// The chat page's entry module: keyboard and click handlers, the sidebar's rename/delete, the settings panel.
import { bindAttach, viewAttachment } from "./chat_attach.js";
import { bindBranchEvents } from "./chat_branches.js";
import { composerChanged } from "./chat_context.js";
import { autoGrow, clearError, fillSettings, showError } from "./chat_render.js";
import { startSearch } from "./chat_search.js";
import { bindModels, loadModels } from "./chat_models.js";
import { bindSettings, loadPresets } from "./chat_settings.js";
import { deleteSession, ensureSession, openSession, renameSession } from "./chat_sessions.js";
import { bindElements, state, ui } from "./chat_state.js";
import { refreshSessions, showBlankChat } from "./chat_sync.js";
import { regenerateReply, startEdit, stopReply, submitMessage } from "./chat_turns.js";
import * as view from "./chat_view.js";

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
    if (!state.current || state.current.id !== session.id) openSession(session.id);
  } else if (action === "rename") {
    const form = view.renameForm(session);
    item.replaceChildren(form);
    const input = form.querySelector("input");
    input.focus();
    input.select();
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const title = input.value.trim();
      if (title) renameSession(session.id, title);
      else refreshSessions();
    });
    input.addEventListener("keydown", (e) => {
      if (e.key === "Escape") refreshSessions();
    });
  } else if (action === "delete") {
    const box = view.deleteConfirm(session);
    item.replaceChildren(box);
    box.querySelector("[data-action=confirm-delete]").focus();
  } else if (action === "confirm-delete") {
    deleteSession(session.id);
  } else if (action === "cancel") {
    refreshSessions().catch((e) => showError(e.message));
  }
}

// ---- messages ----------------------------------------------------------------------------------------------
function onMessagesClick(event) {
  const target = event.target.closest("[data-action]");
  if (!target) return;
  const node = target.closest(".msg");
  const action = target.dataset.action;
  if (action === "regenerate" && !state.streaming) {
    regenerateReply(node);
  } else if (action === "edit" && !state.streaming) {
    startEdit(node);
  } else if (action === "view-attachment") {
    viewAttachment(Number(target.dataset.attachmentId));
  } else if (action === "toggle-long") {
    view.setCollapsed(node, !node.classList.contains("is-collapsed"));
  } else if (action === "copy") {
    navigator.clipboard.writeText(node.dataset.text || "").then(
      () => {
        target.textContent = "Copied";
        setTimeout(() => (target.textContent = "Copy"), 1500);
      },
      () => showError("The browser did not allow copying to the clipboard."),
    );
  }
}

// ---- settings ----------------------------------------------------------------------------------------------
function setSettingsOpen(open) {
  ui.settingsPanel.hidden = !open;
  ui.app.classList.toggle("settings-open", open);
  ui.toggleSettings.setAttribute("aria-expanded", String(open));
  if (open) {
    fillSettings();
    ui.settingsForm.elements.system_prompt.focus();
  } else {
    ui.toggleSettings.focus();
  }
}

// ---- start -------------------------------------------------------------------------------------------------
function bindEvents() {
  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    submitMessage();
  });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.altKey && !e.ctrlKey && !e.metaKey && !e.isComposing) {
      e.preventDefault();
      submitMessage();
    }
  });
  ui.input.addEventListener("input", () => {
    autoGrow();
    composerChanged(); // advice about other text goes; a long paste is checked after a pause
  });
  ui.stop.addEventListener("click", stopReply);
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (state.streaming) stopReply();
    else if (!ui.settingsPanel.hidden) setSettingsOpen(false);
    else if (ui.app.classList.contains("sidebar-open")) setSidebarOpen(false);
  });
  ui.newChat.addEventListener("click", () => {
    setSidebarOpen(false);
    showBlankChat();
    ui.input.focus();
  });
  ui.toggleSidebar.addEventListener("click", () => setSidebarOpen(!ui.app.classList.contains("sidebar-open")));
  ui.scrim.addEventListener("click", () => setSidebarOpen(false));
  ui.sessionList.addEventListener("click", onSidebarClick);
  ui.messages.addEventListener("click", onMessagesClick);
  bindBranchEvents();
  bindAttach({ ensureSession });
  ui.errorClose.addEventListener("click", clearError);
  ui.toggleSettings.addEventListener("click", () => setSettingsOpen(ui.settingsPanel.hidden));
  ui.settingsClose.addEventListener("click", () => setSettingsOpen(false));
  bindSettings();
  window.addEventListener("hashchange", () => {
    const id = new URLSearchParams(location.hash.slice(1)).get("s");
    if (id && (!state.current || state.current.id !== id)) openSession(id);
  });
}

async function start() {
  bindElements();
  bindEvents();
  bindModels();
  startSearch({ onOpen: () => setSidebarOpen(false) });
  try {
    await Promise.all([refreshSessions(), loadPresets(), loadModels()]);
  } catch (e) {
    showError(e.message);
  }
  const wanted = new URLSearchParams(location.hash.slice(1)).get("s");
  const target = state.sessions.find((s) => s.id === wanted) || state.sessions[0];
  if (target) await openSession(target.id);
  else showBlankChat();
  document.body.dataset.ready = "true";
  ui.input.focus();
}

// a module runs once the document is parsed (like `defer`), so the elements are there
start();
