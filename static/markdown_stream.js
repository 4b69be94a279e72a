// A reply's Markdown while it streams in: the top-level blocks that are complete are rendered once and kept (their
// nodes stay, so a selection or a click on them survives); only the trailing open block is parsed and rendered
// again on each update. The final text is then rendered whole and reconciled: blocks that came out the same keep
// their nodes.
//
// A block is complete once the lines after it can no longer change it. Only complete lines (up to the last
// newline) decide: a partial "#" could still become "#tag". Then every block but the last is closed (another has
// begun after it); the last is closed when it is a heading or rule, a paragraph, table or quote with a blank line
// after it, or a fenced block with its closing fence. Lists and indented code stay open until a next block starts.
import { parse, render, renderTokens } from "./markdown.js";

const CLOSED_BY_BLANK = new Set(["paragraph_open", "table_open", "blockquote_open"]);
const FENCE_CLOSE = /^ {0,3}(`{3,}|~{3,})[ \t]*$/;

// container -> { done: the text of its kept blocks, env, tail: the nodes of the open block, checkedTo }
const streams = new WeakMap();

function normalize(text) {
  return String(text == null ? "" : text).replace(/\r\n?/g, "\n");
}

/** Show `text`, a prefix of a reply still streaming, in `container`, re-rendering only its open block. */
export function streamInto(container, text) {
  text = normalize(text);
  let stream = streams.get(container);
  if (!stream || !text.startsWith(stream.done)) {
    stream = { done: "", env: {}, tail: [], checkedTo: 0 };
    streams.set(container, stream);
    container.replaceChildren();
  }
  for (const node of stream.tail) node.remove();
  const lastNewline = text.lastIndexOf("\n") + 1;
  if (lastNewline > stream.checkedTo) {
    stream.checkedTo = lastNewline;
    const kept = closedBlocks(text.slice(stream.done.length, lastNewline), stream.env);
    if (kept) {
      container.appendChild(renderTokens(kept.tokens, stream.env));
      stream.done += kept.text;
    }
  }
  const tail = renderTokens(parse(text.slice(stream.done.length), stream.env), stream.env);
  stream.tail = Array.from(tail.childNodes);
  container.appendChild(tail);
}

/** Whether `container` shows a streamed text that renderInto() has not yet rendered whole. */
export function isStreamed(container) {
  return streams.has(container);
}

/** Replace what `container` shows with the rendering of the whole of `text`, keeping the nodes of every
 *  top-level block that renders the same (the blocks kept while it streamed, usually all but the last). */
export function renderInto(container, text) {
  streams.delete(container);
  const fresh = Array.from(render(normalize(text)).childNodes);
  const old = Array.from(container.childNodes);
  fresh.forEach((node, i) => {
    if (i >= old.length) container.appendChild(node);
    else if (!old[i].isEqualNode(node)) container.replaceChild(node, old[i]);
  });
  for (const node of old.slice(fresh.length)) node.remove();
}

/** The tokens and text of the complete top-level blocks at the start of `source` (whole lines), or null. */
function closedBlocks(source, env) {
  const tokens = parse(source, env);
  const starts = [];
  tokens.forEach((token, i) => {
    if (token.level === 0 && token.nesting >= 0) starts.push(i);
  });
  if (!starts.length || starts.some((i) => !tokens[i].map)) return null; // a block without lines: keep it open
  const lines = source.split("\n").slice(0, -1); // source ends with a newline
  const last = tokens[starts[starts.length - 1]];
  let endToken = starts[starts.length - 1];
  let endLine = last.map[0];
  if (isClosed(last, lines)) {
    endToken = tokens.length;
    endLine = last.map[1];
  }
  if (endToken === 0) return null;
  let length = 0;
  for (let i = 0; i < endLine; i++) length += lines[i].length + 1;
  return { tokens: tokens.slice(0, endToken), text: source.slice(0, length) };
}

function isClosed(token, lines) {
  const [first, end] = token.map;
  if (token.type === "heading_open" || token.type === "hr") return true;
  if (CLOSED_BY_BLANK.has(token.type)) return end < lines.length && !lines[end].trim();
  if (token.type === "fence" && end - 1 > first) {
    const close = FENCE_CLOSE.exec(lines[end - 1]);
    return close !== null && close[1][0] === token.markup[0] && close[1].length >= token.markup.length;
  }
  return false;
}
