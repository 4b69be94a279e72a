// Over 300 lines on purpose: one renderer kept whole until the chat-UI issue replaces it with maintained libraries.
// Safe Markdown for model output: builds DOM nodes with createElement/textContent only, never innerHTML.
// Supports fenced code, headings, lists (nested), block quotes, rules, paragraphs, `code`, **strong**, *em*,
// ~~strike~~, [links](https://...), <autolinks> and bare http(s) URLs. Raw HTML is shown as text. A link whose
// URL is not absolute http(s) or mailto (javascript:, data:, vbscript:, relative ...) is not a link: its source
// text is shown as written.
const MAX_DEPTH = 8;
const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:\s+(.*)|$)/;
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/;
const ESCAPABLE = /[!-/:-@[-`{-~]/;

/** The normalised href of an absolute http(s)/mailto URL, else null (the URL parser strips the tab and
 *  newline tricks, e.g. "java\tscript:", before the protocol is checked). */
export function safeHref(raw) {
  if (typeof raw !== "string") return null;
  const text = raw.trim();
  if (!text || text.length > 2048) return null;
  let url;
  try {
    url = new URL(text);
  } catch (e) {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function el(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

function link(href, parent) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  parent.appendChild(a);
  return a;
}

function indentOf(line) {
  const m = /^[ \t]*/.exec(line)[0];
  return m.replace(/\t/g, "    ").length;
}

function dedent(line, n) {
  let k = 0;
  while (k < n && k < line.length && (line[k] === " " || line[k] === "\t")) k++;
  return line.slice(k);
}

function startsBlock(line) {
  return FENCE.test(line) || QUOTE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line);
}

// ---- blocks ---------------------------------------------------------------------------------------------
function renderBlocks(lines, parent, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i++;
    } else if ((m = FENCE.exec(line))) {
      i = renderFence(lines, i, m, parent);
    } else if (depth < MAX_DEPTH && QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        body.push(m[1]);
        i++;
      }
      const quote = el("blockquote");
      renderBlocks(body, quote, depth + 1);
      parent.appendChild(quote);
    } else if ((m = HEADING.exec(line))) {
      const heading = el("h" + Math.min(6, m[1].length + 2)); // h3..h6: a reply sits under the page's headings
      renderInline(m[2], heading, depth);
      parent.appendChild(heading);
      i++;
    } else if (RULE.test(line)) {
      parent.appendChild(el("hr"));
      i++;
    } else if (depth < MAX_DEPTH && ITEM.test(line)) {
      i = renderList(lines, i, parent, depth);
    } else {
      const para = [line.trim()];
      i++;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) {
        para.push(lines[i].trim());
        i++;
      }
      const p = el("p");
      renderInline(para.join("\n"), p, depth);
      parent.appendChild(p);
    }
  }
}

function renderFence(lines, i, m, parent) {
  const marker = m[1];
  const lang = m[2];
  const body = [];
  i++;
  while (i < lines.length) {
    const t = lines[i].trim();
    if (t.startsWith(marker) && t.split(marker[0]).join("") === "") break; // a closing fence
    body.push(lines[i]);
    i++;
  }
  const pre = el("pre");
  const code = el("code", body.join("\n")); // an unclosed fence (still streaming) runs to the end
  if (lang && /^[\w+#.-]{1,24}$/.test(lang)) {
    code.className = "language-" + lang;
    pre.dataset.lang = lang;
  }
  pre.appendChild(code);
  parent.appendChild(pre);
  return i + 1;
}

function isOrdered(marker) {
  return /\d/.test(marker);
}

function renderList(lines, i, parent, depth) {
  const first = ITEM.exec(lines[i]);
  const baseIndent = first[1].length;
  const ordered = isOrdered(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== baseIndent || isOrdered(m[2]) !== ordered) break;
    const contentIndent = m[1].length + m[2].length + 1;
    const body = [m[3] || ""];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        let j = i + 1;
        while (j < lines.length && !lines[j].trim()) j++;
        if (j < lines.length && indentOf(lines[j]) > baseIndent) {
          body.push("");
          i++;
          continue;
        }
        break;
      }
      const indent = indentOf(line);
      if (indent > baseIndent) {
        body.push(dedent(line, contentIndent));
      } else if (startsBlock(line)) {
        break;
      } else {
        body.push(line.trim()); // a lazy continuation of the item's paragraph
      }
      i++;
    }
    const item = el("li");
    renderBlocks(body, item, depth + 1);
    list.appendChild(item);
    // a blank line between items of the same list keeps the list going
    let j = i;
    while (j < lines.length && !lines[j].trim()) j++;
    const next = j < lines.length ? ITEM.exec(lines[j]) : null;
    if (j > i && next && next[1].length === baseIndent && isOrdered(next[2]) === ordered) i = j;
  }
  parent.appendChild(list);
  return i;
}

// ---- inlines --------------------------------------------------------------------------------------------
function renderInline(text, parent, depth) {
  let buf = "";
  const flush = () => {
    if (buf) parent.appendChild(document.createTextNode(buf));
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const prev = i > 0 ? text[i - 1] : " ";
    if (c === "\\" && i + 1 < text.length && ESCAPABLE.test(text[i + 1])) {
      buf += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "\n") {
      flush();
      parent.appendChild(el("br"));
      i++;
      continue;
    }
    if (c === "`") {
      let n = 1;
      while (text[i + n] === "`") n++;
      const end = text.indexOf("`".repeat(n), i + n);
      if (end > i) {
        flush();
        parent.appendChild(el("code", text.slice(i + n, end).replace(/^ (.*) $/s, "$1")));
        i = end + n;
      } else {
        buf += "`".repeat(n);
        i += n;
      }
      continue;
    }
    const span = depth < MAX_DEPTH ? matchSpan(text, i, prev) : null;
    if (span) {
      flush();
      i = span(parent, depth);
      continue;
    }
    buf += c;
    i++;
  }
  flush();
}

/** A renderer for the span starting at i (returns the index after it), or null when none starts there. */
function matchSpan(text, i, prev) {
  const c = text[i];
  const rest = text.slice(i);
  if (c === "[" || (c === "!" && text[i + 1] === "[")) return matchLink(text, i);
  if (c === "<") {
    const m = /^<(https?:\/\/[^\s<>]+|mailto:[^\s<>]+)>/.exec(rest);
    const href = m && safeHref(m[1]);
    if (!href) return null;
    return (parent) => {
      link(href, parent).textContent = m[1];
      return i + m[0].length;
    };
  }
  if ((c === "h" || c === "H") && !/[\w/]/.test(prev)) {
    const m = BARE_URL.exec(rest);
    if (!m) return null;
    const url = m[0].replace(/[.,;:!?'")\]]+$/, "");
    const href = safeHref(url);
    if (!href) return null;
    return (parent) => {
      link(href, parent).textContent = url;
      return i + url.length;
    };
  }
  for (const [delim, tag] of [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"], ["_", "em"]]) {
    if (!rest.startsWith(delim)) continue;
    if (delim[0] === "_" && /\w/.test(prev)) return null; // snake_case words are not emphasis
    const inner = i + delim.length;
    if (inner >= text.length || /\s/.test(text[inner])) continue;
    let end = text.indexOf(delim, inner + 1);
    while (end > 0 && (/\s/.test(text[end - 1]) || (delim === "*" && text[end + 1] === "*"))) {
      end = text.indexOf(delim, end + (delim === "*" && text[end + 1] === "*" ? 2 : 1));
    }
    if (end < 0 || (delim[0] === "_" && /\w/.test(text[end + delim.length] || ""))) continue;
    return (parent, depth) => {
      const node = el(tag);
      renderInline(text.slice(inner, end), node, depth + 1);
      parent.appendChild(node);
      return end + delim.length;
    };
  }
  return null;
}

function matchLink(text, i) {
  const image = text[i] === "!";
  const open = image ? i + 1 : i;
  let level = 0;
  let close = -1;
  for (let k = open; k < text.length && k < open + 1000; k++) {
    if (text[k] === "\\") k++;
    else if (text[k] === "[") level++;
    else if (text[k] === "]" && --level === 0) {
      close = k;
      break;
    }
  }
  if (close < 0 || text[close + 1] !== "(") return null;
  level = 0;
  let end = -1;
  for (let k = close + 1; k < text.length && k < close + 2100; k++) {
    if (text[k] === "(") level++;
    else if (text[k] === ")" && --level === 0) {
      end = k;
      break;
    }
  }
  if (end < 0) return null;
  const label = text.slice(open + 1, close);
  const target = text.slice(close + 2, end).trim().split(/\s+/)[0] || "";
  const href = safeHref(target.replace(/^<(.*)>$/, "$1"));
  return (parent, depth) => {
    if (!href) {
      parent.appendChild(document.createTextNode(text.slice(i, end + 1))); // not a link: shown as written
    } else {
      const a = link(href, parent);
      if (image) {
        a.className = "md-image-link";
        a.textContent = label || href;
      } else {
        renderInline(label, a, depth + 1);
      }
    }
    return end + 1;
  };
}

/** Render Markdown `source` to a DocumentFragment of safe nodes. */
export function render(source) {
  const fragment = document.createDocumentFragment();
  const text = String(source == null ? "" : source).replace(/\r\n?/g, "\n");
  renderBlocks(text.split("\n"), fragment, 0);
  return fragment;
}

/** Replace `container`'s children with the rendering of `source`. */
export function renderInto(container, source) {
  container.replaceChildren(render(source));
}
