// The sidebar's search over the user's chats (GET /api/search) and the header's Export menu (GET
// /api/sessions/{id}/export). Snippets arrive as the message's own text with U+0002 / U+0003 around each match: the
// text goes in through text nodes, and only those markers become <mark> elements (never innerHTML).
import { api } from "./chat_api.js";
import { showBranchThrough } from "./chat_branches.js";
import { openSession } from "./chat_sessions.js";
import { state } from "./chat_state.js";

const DEBOUNCE_MS = 200;
const PAGE_SIZE = 20;
const HIT_FLASH_MS = 2500;
const MARK_START = "\u0002";
const MARK_END = "\u0003";
const EXPORT_FORMATS = { "export-md": "md", "export-json": "json" };

const ui = {};
let timer = null;
let generation = 0; // answers to an older query than the latest are dropped
let onOpenHit = () => {};

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A snippet as nodes: its text as text, each marked run inside a <mark>. */
export function snippetNodes(snippet) {
  const nodes = [];
  let marked = false;
  for (const part of snippet.split(/([\u0002\u0003])/)) {
    if (part === MARK_START || part === MARK_END) {
      marked = part === MARK_START;
    } else if (part) {
      nodes.push(marked ? el("mark", null, part) : document.createTextNode(part));
    }
  }
  return nodes;
}

function hitItem(hit) {
  const li = el("li", "search-hit");
  li.dataset.sessionId = hit.session_id;
  li.dataset.messageId = hit.message_id;
  const open = el("button", "search-open");
  open.type = "button";
  open.appendChild(el("span", "search-title", hit.title || "Untitled chat"));
  const snippet = el("span", "search-snippet");
  snippet.append(...snippetNodes(hit.snippet));
  open.appendChild(snippet);
  const more = hit.num_matches > 1 ? " · " + hit.num_matches + " matching messages" : "";
  open.appendChild(el("span", "search-meta", (hit.role === "user" ? "You" : "Assistant") + more));
  li.appendChild(open);
  return li;
}

function setStatus(text) {
  ui.status.textContent = text || "";
  ui.status.hidden = !text;
}

function showResults(on) {
  ui.results.hidden = !on;
  ui.sessionList.hidden = on;
  if (!on) {
    ui.results.replaceChildren();
    setStatus("");
  }
}

async function runSearch(query, offset) {
  const mine = ++generation;
  const params = new URLSearchParams({ q: query, limit: String(PAGE_SIZE), offset: String(offset) });
  let body;
  try {
    body = await api("GET", "/api/search?" + params);
  } catch (e) {
    if (mine === generation) setStatus(e.message);
    return;
  }
  if (mine !== generation) return;
  const items = body.results.map(hitItem);
  if (offset === 0) ui.results.replaceChildren(...items);
  else {
    ui.results.querySelector(".search-more")?.remove();
    ui.results.append(...items);
  }
  if (body.next_offset !== null) {
    const li = el("li", "search-more");
    const more = el("button", "btn btn-small btn-ghost", "More results");
    more.type = "button";
    more.addEventListener("click", () => runSearch(query, body.next_offset));
    li.appendChild(more);
    ui.results.appendChild(li);
  }
  setStatus(ui.results.querySelector(".search-hit") ? "" : "No chat matches “" + query.trim() + "”.");
}

function onInput() {
  clearTimeout(timer);
  const query = ui.input.value;
  if (!query.trim()) {
    generation++;
    showResults(false);
    return;
  }
  showResults(true);
  timer = setTimeout(() => runSearch(query, 0), DEBOUNCE_MS);
}

/** Open the hit's chat, then bring its message into view and flash it. A message of another branch (an older
 * version of an edited message or a regenerated reply) is searched too: its branch is put on show first. */
async function openHit(item) {
  onOpenHit();
  const sessionId = item.dataset.sessionId;
  if (!state.current || state.current.id !== sessionId) await openSession(sessionId);
  const selector = '#messages .msg[data-id="' + CSS.escape(item.dataset.messageId) + '"]';
  let message = document.querySelector(selector);
  if (!message && state.current && state.current.id === sessionId) {
    if (await showBranchThrough(Number(item.dataset.messageId))) message = document.querySelector(selector);
  }
  if (!message) return;
  message.scrollIntoView({ block: "center" });
  message.classList.add("is-search-hit");
  setTimeout(() => message.classList.remove("is-search-hit"), HIT_FLASH_MS);
}

/** The export links point at the open chat when the menu opens (nothing to export before a chat exists). */
function fillExportMenu() {
  for (const [id, format] of Object.entries(EXPORT_FORMATS)) {
    const link = document.getElementById(id);
    if (state.current) {
      link.href = "/api/sessions/" + encodeURIComponent(state.current.id) + "/export?format=" + format;
      link.removeAttribute("aria-disabled");
    } else {
      link.removeAttribute("href");
      link.setAttribute("aria-disabled", "true");
    }
  }
}

/** Wire the search box and the export menu; `onOpen` runs when a result is opened (the sidebar closes). */
export function startSearch({ onOpen } = {}) {
  Object.assign(ui, {
    form: document.getElementById("chat-search"),
    input: document.getElementById("search-input"),
    results: document.getElementById("search-results"),
    status: document.getElementById("search-status"),
    sessionList: document.getElementById("session-list"),
    exportMenu: document.getElementById("export-menu"),
  });
  if (onOpen) onOpenHit = onOpen;
  ui.input.addEventListener("input", onInput);
  ui.form.addEventListener("submit", (e) => {
    e.preventDefault();
    clearTimeout(timer);
    if (ui.input.value.trim()) runSearch(ui.input.value, 0);
  });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || !ui.input.value) return;
    e.stopPropagation(); // clears the search only, not the page's other Escape actions
    ui.input.value = "";
    onInput();
  });
  ui.results.addEventListener("click", (e) => {
    const item = e.target.closest(".search-hit");
    if (item) openHit(item);
  });
  ui.exportMenu.addEventListener("toggle", () => {
    if (ui.exportMenu.open) fillExportMenu();
  });
  ui.exportMenu.addEventListener("click", (e) => {
    if (e.target.closest("a[href]")) ui.exportMenu.open = false;
  });
  document.addEventListener("click", (e) => {
    if (ui.exportMenu.open && !ui.exportMenu.contains(e.target)) ui.exportMenu.open = false;
  });
}
