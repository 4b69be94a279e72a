// The chat page's state and its elements, shared by the chat_*.js modules that import them. The browser tests
// read it too: `(await import("/static/chat_state.js")).state`.
export const DEFAULT_TITLE = "New chat";
export const SETTING_FIELDS = ["temperature", "top_p", "top_k", "repetition_penalty", "max_tokens"];

export const state = {
  sessions: [],
  // the open session, as the API returns it
  current: null,
  socket: null,
  // a reply of ours is being generated (or its request is on its way)
  streaming: false,
  // a frame was sent and the server has not yet accepted it with `start`
  awaitingStart: false,
  // the message the server has not accepted yet: {frame, text, node, sent, uncertain, afterId} (chat_outbox.js)
  outbox: null,
  // the last regenerate/edit/continue turn, to send again with a `truncate` choice (chat_turns.js beginTurn)
  resendTurn: null,
  // the user pressed Stop on the running reply
  stopRequested: false,
  assistantNode: null,
  // the bubble that says how far the prompt has been read, until the reply's first token
  progressNode: null,
  assistantText: "",
  renderQueued: false,
  // when the streamed text was last drawn (performance.now()): draws are throttled
  lastRenderAt: 0,
  // the files attached to the next message: {id, filename, bytes, tokens} (id 0 while uploading; chat_attach.js)
  composerFiles: [],
  // the caller's presets (GET /api/presets) and the one new chats follow
  presets: [],
  defaultPresetId: null,
};

/** The page's elements by role, filled in once by bindElements(). */
export const ui = {};

const ELEMENT_IDS = {
  app: "app", sidebar: "sidebar", scrim: "scrim", sessionList: "session-list", newChat: "new-chat",
  toggleSidebar: "toggle-sidebar", title: "chat-title", connStatus: "conn-status", messages: "messages",
  empty: "empty-state", composer: "composer", composerNotice: "composer-notice", input: "input", send: "send",
  stop: "stop",
  errorBanner: "error-banner", errorText: "error-text", errorClose: "error-close",
  toggleSettings: "toggle-settings", settingsPanel: "settings-panel", settingsForm: "settings-form",
  settingsError: "settings-error", settingsStatus: "settings-status", settingsClose: "settings-close",
  attachButton: "attach", attachInput: "attach-input", attachChips: "attach-chips", attachError: "attach-error",
  modelPicker: "model-picker", modelNote: "model-note",
  attachDialog: "attach-dialog", attachTitle: "attach-title", attachText: "attach-text", attachClose: "attach-close",
};

export function bindElements() {
  for (const [key, id] of Object.entries(ELEMENT_IDS)) ui[key] = document.getElementById(id);
}
