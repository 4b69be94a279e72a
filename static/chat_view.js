// DOM builders of the chat page: message bubbles, the quiet stats line, sidebar entries. Text goes in through
// textContent (user text) or the safe Markdown renderer (model output), never through innerHTML.
import { isStreamed, renderInto, streamInto } from "./markdown_stream.js";
import { FinishReason, ReplyStatus } from "./protocol.js";

// the badge of a reply that did not finish (a finished one has none)
const STATUS_LABELS = {
  [ReplyStatus.STOPPED]: "stopped",
  [ReplyStatus.INTERRUPTED]: "interrupted",
  [ReplyStatus.FAILED]: "failed",
  [ReplyStatus.STREAMING]: "incomplete",
};

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";
const ICON_PATHS = {
  rename: ["M17 3a2.85 2.85 0 1 1 4 4L7.5 20.5 2 22l1.5-5.5Z"],
  delete: ["M3 6h18", "M19 6v14a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V6", "M8 6V4a2 2 0 0 1 2-2h4a2 2 0 0 1 2 2v2"],
};

function icon(name) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("width", "15");
  svg.setAttribute("height", "15");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("fill", "none");
  svg.setAttribute("stroke", "currentColor");
  svg.setAttribute("stroke-width", "2");
  svg.setAttribute("stroke-linecap", "round");
  svg.setAttribute("stroke-linejoin", "round");
  for (const d of ICON_PATHS[name]) {
    const path = document.createElementNS(SVG_NS, "path");
    path.setAttribute("d", d);
    svg.appendChild(path);
  }
  return svg;
}

function iconButton(name, label) {
  const b = el("button", "icon-btn session-tool");
  b.type = "button";
  b.dataset.action = name;
  b.title = label;
  b.setAttribute("aria-label", label);
  b.appendChild(icon(name));
  return b;
}

function button(label, action, className) {
  const b = el("button", className || "link-btn", label);
  b.type = "button";
  b.dataset.action = action;
  return b;
}

function formatSeconds(s) {
  return s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(s < 10 ? 2 : 1) + " s";
}

/** The quiet line under an assistant message: tokens, tokens/s, TTFT (and a model load waited for), cached prompt
 * tokens. */
export function statsText(message) {
  const parts = [];
  const timings = message.timings || {};
  if (message.completion_tokens != null) {
    parts.push(message.completion_tokens + (message.completion_tokens === 1 ? " token" : " tokens"));
  }
  if (timings.decode_tokens_per_s != null) parts.push(timings.decode_tokens_per_s.toFixed(1) + " tok/s");
  if (timings.ttft_s != null) parts.push("TTFT " + formatSeconds(timings.ttft_s));
  // the engine's TTFT starts once the model is loaded: a turn that waited for the load says how long
  if (timings.model_load_s != null) parts.push("after " + formatSeconds(timings.model_load_s) + " loading the model");
  if (message.prompt_tokens) {
    parts.push((message.cached_tokens || 0) + " of " + message.prompt_tokens + " prompt tokens cached");
  }
  if (message.truncated_turns) {
    // only ever at the user's choice (the composer asked): a record of what this reply did not see
    parts.push(message.truncated_turns + " earlier turn" + (message.truncated_turns === 1 ? "" : "s") +
      " left out, as you chose");
  }
  if (message.finish_reason === FinishReason.LENGTH) parts.push("hit the token limit");
  return parts.join(" · ");
}

/** The "‹ 2/3 ›" switch of a message with several versions (regenerated replies, edited messages); null without. */
export function versionNav(message) {
  const ids = message.sibling_ids || [];
  const index = message.sibling_index;
  if (ids.length < 2 || !Number.isInteger(index)) return null;
  const nav = el("span", "msg-versions");
  nav.setAttribute("role", "group");
  nav.setAttribute("aria-label", "Versions");
  nav.dataset.siblingIds = ids.join(",");
  nav.dataset.index = String(index);
  const prev = button("‹", "version-prev", "link-btn version-btn");
  prev.setAttribute("aria-label", "Previous version");
  prev.disabled = index === 0;
  const next = button("›", "version-next", "link-btn version-btn");
  next.setAttribute("aria-label", "Next version");
  next.disabled = index === ids.length - 1;
  nav.append(prev, el("span", "version-label", index + 1 + "/" + ids.length), next);
  return nav;
}

function actionsRow(message, ...buttons) {
  const actions = el("div", "msg-actions");
  const nav = versionNav(message);
  if (nav) actions.appendChild(nav);
  actions.append(...buttons);
  return actions;
}

export function tokensText(tokens) {
  return tokens === 1 ? "1 token" : tokens + " tokens";
}

/** A message's attached files as chips: name and tokens, a button that opens the text (chat_attach.js). */
export function attachmentChips(attachments) {
  const row = el("div", "msg-attachments");
  for (const file of attachments) {
    const chip = el("button", "attach-chip");
    chip.type = "button";
    chip.dataset.action = "view-attachment";
    chip.dataset.attachmentId = file.id;
    chip.title = "Show the text the model reads";
    chip.append(el("span", "attach-name", file.filename), el("span", "attach-detail", tokensText(file.tokens)));
    row.append(chip);
  }
  return row;
}

// a user message longer than this (a pasted document) shows its first lines, faded, with "Show all"
const LONG_MESSAGE_LINES = 20;
const LONG_MESSAGE_CHARS = 1500;

/** Whether a user message is long enough to show collapsed. */
export function isLongMessage(text) {
  return text.length > LONG_MESSAGE_CHARS || text.split("\n").length > LONG_MESSAGE_LINES;
}

export function userMessage(message) {
  const node = el("article", "msg msg-user");
  node.dataset.role = "user";
  if (message.id != null) node.dataset.id = message.id;
  node.setAttribute("aria-label", "You");
  // the files the prompt reads before the question: chips, not their text
  if (message.attachments && message.attachments.length) node.appendChild(attachmentChips(message.attachments));
  const body = el("div", "msg-body", message.content); // plain text: white-space keeps the lines
  node.appendChild(body);
  if (isLongMessage(message.content || "")) {
    body.id = "msg-body-" + (message.id != null ? message.id : Math.random().toString(36).slice(2));
    const toggle = button("Show all", "toggle-long", "link-btn msg-toggle");
    toggle.setAttribute("aria-controls", body.id);
    node.appendChild(toggle);
    setCollapsed(node, true);
  }
  node.appendChild(actionsRow(message, button("Edit", "edit")));
  return node;
}

/** Collapse a long user message to its first lines, or show all of it. */
export function setCollapsed(node, collapsed) {
  node.classList.toggle("is-collapsed", collapsed);
  const toggle = node.querySelector(".msg-toggle");
  toggle.textContent = collapsed ? "Show all" : "Show less";
  toggle.setAttribute("aria-expanded", String(!collapsed));
}

export function assistantMessage(message) {
  const node = el("article", "msg msg-assistant");
  node.dataset.role = "assistant";
  node.setAttribute("aria-label", "Assistant");
  if (message.id != null) node.dataset.id = message.id;
  node.appendChild(el("div", "msg-body markdown"));
  const meta = el("div", "msg-meta");
  meta.appendChild(el("span", "msg-badge"));
  meta.appendChild(el("span", "msg-stats"));
  node.appendChild(meta);
  node.appendChild(el("p", "msg-error"));
  const more = button("Continue", "continue");
  more.title = "Continue the reply where it stopped at its token limit";
  node.appendChild(actionsRow(message, button("Regenerate", "regenerate"), more, button("Copy", "copy")));
  setAssistantText(node, message.content || "");
  finishAssistant(node, message);
  return node;
}

/** Render the whole of a reply's text (its final text, or a stored one). */
export function setAssistantText(node, text) {
  node.dataset.text = text;
  renderInto(node.querySelector(".msg-body"), text);
}

/** Show the text of a reply so far while it streams: only its last, still open block is rendered again. */
export function streamAssistantText(node, text) {
  node.dataset.text = text;
  streamInto(node.querySelector(".msg-body"), text);
}

/** What a reply's bubble says before its first token: its place in the queue, or how much of the prompt is read. */
export function progressText(progress) {
  const count = (n) => Number(n).toLocaleString("en-US");
  if (progress.queue_position != null) {
    const ahead = progress.queue_position - 1;
    return ahead > 0 ? `waiting: ${count(ahead)} ahead in the queue…` : "waiting: next in the queue…";
  }
  const cached = progress.cached ? ` (${count(progress.cached)} from cache)` : "";
  return `reading ${count(progress.processed)} of ${count(progress.total)} tokens${cached}…`;
}

/** A reply's bubble before its first token, saying how far its prompt has been read (see progressText). */
export function progressMessage(progress) {
  const node = el("article", "msg-reading");
  node.dataset.role = "assistant";
  node.setAttribute("aria-busy", "true");
  node.setAttribute("aria-label", "Assistant");
  node.appendChild(el("p", "msg-progress", progressText(progress)));
  return node;
}

/** Mark a bubble as streaming (typing indicator, aria-busy) until finishAssistant(). */
export function startStreaming(node) {
  node.classList.add("is-streaming");
  node.setAttribute("aria-busy", "true");
  node.dataset.status = ReplyStatus.STREAMING;
  node.querySelector(".msg-badge").textContent = "";
  node.querySelector(".msg-stats").textContent = "";
}

export function finishAssistant(node, message) {
  node.classList.remove("is-streaming");
  node.setAttribute("aria-busy", "false");
  // a streamed reply ends rendered whole (the last deltas may not be drawn yet: renders are throttled)
  const body = node.querySelector(".msg-body");
  if (message.content != null && (message.content !== node.dataset.text || isStreamed(body))) {
    setAssistantText(node, message.content);
  }
  const status = message.status || ReplyStatus.FINISHED;
  node.dataset.status = status;
  node.dataset.finishReason = message.finish_reason || "";
  if (message.id != null) node.dataset.id = message.id;
  const label = STATUS_LABELS[status] || "";
  const badge = node.querySelector(".msg-badge");
  badge.textContent = label;
  badge.className = "msg-badge" + (label ? " badge-" + status : "");
  node.querySelector(".msg-stats").textContent = statsText(message);
  node.querySelector(".msg-error").textContent = message.error ? message.error : "";
  if (!message.content && status !== ReplyStatus.FINISHED) {
    node.querySelector(".msg-body").replaceChildren(el("p", "msg-empty", "(no text)"));
  }
}

export function sessionItem(session, isCurrent) {
  const li = el("li", "session" + (isCurrent ? " is-current" : ""));
  li.dataset.id = session.id;
  const open = el("button", "session-open", session.title || "Untitled chat");
  open.type = "button";
  open.dataset.action = "open";
  open.title = session.title || "Untitled chat";
  if (isCurrent) open.setAttribute("aria-current", "true");
  li.appendChild(open);
  const name = "“" + (session.title || "Untitled chat") + "”";
  li.appendChild(iconButton("rename", "Rename " + name));
  li.appendChild(iconButton("delete", "Delete " + name));
  return li;
}

export function renameForm(session) {
  const form = el("form", "session-rename");
  const input = el("input");
  input.type = "text";
  input.name = "title";
  input.maxLength = 200;
  input.value = session.title || "";
  input.setAttribute("aria-label", "New title");
  form.appendChild(input);
  const save = el("button", "btn btn-small btn-primary", "Save");
  save.type = "submit";
  form.appendChild(save);
  form.appendChild(button("Cancel", "cancel", "btn btn-small"));
  return form;
}

export function deleteConfirm(session) {
  const box = el("div", "session-confirm");
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", "Confirm deletion");
  box.appendChild(el("span", null, "Delete “" + (session.title || "Untitled chat") + "”?"));
  box.appendChild(button("Delete", "confirm-delete", "btn btn-small btn-danger"));
  box.appendChild(button("Cancel", "cancel", "btn btn-small"));
  return box;
}
