// Files attached to the next message: the paperclip button and drag-and-drop on the composer upload each file to
// the open chat (one is created for the first); each shows as a chip (name, size, tokens, ×) until the message goes
// out with their ids. A sent message shows its files as chips; a click opens the file's text in a dialog.
import { ApiError, api } from "./chat_api.js";
import { state, ui } from "./chat_state.js";
import { el, tokensText } from "./chat_view.js";

let ensureSession = null; // chat_sessions.js's, handed in by bindAttach (no import cycle)

/** Wire the button, the file input, the composer's drop zone and the chips' remove buttons. */
export function bindAttach(options) {
  ensureSession = options.ensureSession;
  ui.attachButton.addEventListener("click", () => ui.attachInput.click());
  ui.attachInput.addEventListener("change", () => {
    const files = [...ui.attachInput.files];
    ui.attachInput.value = ""; // the same file may be chosen again
    uploadAll(files);
  });
  ui.composer.addEventListener("dragover", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault(); // allows the drop
    ui.composer.classList.add("is-dropping");
  });
  ui.composer.addEventListener("dragleave", () => ui.composer.classList.remove("is-dropping"));
  ui.composer.addEventListener("drop", (e) => {
    ui.composer.classList.remove("is-dropping");
    if (!hasFiles(e)) return;
    e.preventDefault();
    uploadAll([...e.dataTransfer.files]);
  });
  ui.attachChips.addEventListener("click", (e) => {
    const button = e.target.closest("[data-action=remove-attachment]");
    if (button) removeFile(Number(button.closest(".attach-chip").dataset.id));
  });
  ui.attachClose.addEventListener("click", () => ui.attachDialog.close());
}

function hasFiles(event) {
  return event.dataTransfer && [...event.dataTransfer.types].includes("Files");
}

function sessionPath(id) {
  return "/api/sessions/" + encodeURIComponent(id) + "/attachments";
}

/** Upload files one by one (in the order given); each error is shown at the composer, the others still go. */
async function uploadAll(files) {
  if (!files.length) return;
  clearAttachError();
  try {
    await ensureSession(files[0].name);
  } catch (e) {
    showAttachError(e.message);
    return;
  }
  const sessionId = state.current.id;
  for (const file of files) {
    const pending = { id: 0, filename: file.name, bytes: file.size, tokens: null };
    state.composerFiles.push(pending);
    renderChips();
    try {
      const chip = await upload(sessionId, file);
      if (!state.current || state.current.id !== sessionId) return; // the user moved on: it waits in its chat
      Object.assign(pending, chip);
    } catch (e) {
      state.composerFiles = state.composerFiles.filter((f) => f !== pending);
      showAttachError(file.name + ": " + e.message);
    }
    renderChips();
  }
}

async function upload(sessionId, file) {
  let response;
  try {
    response = await fetch(sessionPath(sessionId) + "?filename=" + encodeURIComponent(file.name), {
      method: "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json", "Content-Type": "application/octet-stream" },
      body: file,
    });
  } catch (e) {
    throw new ApiError(0, "The server cannot be reached. Is it running?");
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.message || "HTTP " + response.status, error.param);
  }
  return data;
}

async function removeFile(id) {
  if (!id || !state.current) return;
  try {
    await api("DELETE", sessionPath(state.current.id) + "/" + id);
  } catch (e) {
    if (e.status !== 404) {
      showAttachError(e.message);
      return;
    }
  }
  state.composerFiles = state.composerFiles.filter((f) => f.id !== id);
  renderChips();
}

/** The files that go with the message being sent (all uploaded: none still on its way), leaving the composer. */
export function takeComposerFiles() {
  const files = state.composerFiles.filter((f) => f.id);
  state.composerFiles = [];
  clearAttachError();
  renderChips();
  return files;
}

/** The ids of the files attached in the composer (uploaded ones). */
export function composerFileIds() {
  return state.composerFiles.filter((f) => f.id).map((f) => f.id);
}

/** Whether a file is still being uploaded (the message waits for it). */
export function uploading() {
  return state.composerFiles.some((f) => !f.id);
}

/** A message that did not go out gives its files back to the composer. */
export function giveBackFiles(files) {
  state.composerFiles = [...(files || []), ...state.composerFiles];
  renderChips();
}

/** The composer of chat `id`: the files that wait in it on the server (none for a blank chat). */
export async function loadComposerFiles(id) {
  state.composerFiles = [];
  clearAttachError();
  renderChips();
  if (!id) return;
  try {
    const data = await api("GET", sessionPath(id));
    if (state.current && state.current.id === id) state.composerFiles = data.attachments;
  } catch (e) {
    showAttachError(e.message);
  }
  renderChips();
}

export function formatBytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(n < 10240 ? 1 : 0) + " KB";
  return (n / 1024 / 1024).toFixed(1) + " MB";
}

function renderChips() {
  const chips = state.composerFiles.map((file) => {
    const chip = el("span", "attach-chip" + (file.id ? "" : " is-uploading"));
    if (file.id) chip.dataset.id = file.id;
    chip.append(el("span", "attach-name", file.filename));
    const detail = file.id ? formatBytes(file.bytes) + " · " + tokensText(file.tokens) : "uploading…";
    chip.append(el("span", "attach-detail", detail));
    if (file.id) {
      const remove = el("button", "icon-btn attach-remove", "×");
      remove.type = "button";
      remove.dataset.action = "remove-attachment";
      remove.setAttribute("aria-label", "Remove " + file.filename);
      chip.append(remove);
    }
    return chip;
  });
  ui.attachChips.replaceChildren(...chips);
  ui.attachChips.hidden = chips.length === 0;
}

/** Open a sent file's text in the dialog. */
export async function viewAttachment(id) {
  if (!state.current || !id) return;
  try {
    const file = await api("GET", sessionPath(state.current.id) + "/" + id);
    ui.attachTitle.textContent = file.filename + " · " + formatBytes(file.bytes) + " · " + tokensText(file.tokens);
    ui.attachText.textContent = file.text;
    ui.attachDialog.showModal();
  } catch (e) {
    showAttachError(e.message);
  }
}

function showAttachError(message) {
  ui.attachError.textContent = message;
  ui.attachError.hidden = false;
}

function clearAttachError() {
  ui.attachError.textContent = "";
  ui.attachError.hidden = true;
}
