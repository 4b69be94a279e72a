// Markdown of model replies, from maintained libraries vendored in static/vendor/ (versions and sha256s in its
// MANIFEST.json): markdown-it parses with raw HTML off (GFM tables and ~~strike~~ built in, task lists and $math$ by
// plugins), highlight.js colours fenced code, DOMPurify sanitizes the HTML before it becomes nodes, and
// markdown_blocks.js adds copy buttons and KaTeX. Raw HTML in a reply is shown as text. A link whose URL is not
// absolute http(s) or mailto (javascript:, data:, vbscript:, relative ...) is not a link: its source text stays.
import DOMPurify from "./vendor/dompurify/purify.es.mjs";
import hljs from "./vendor/highlight.js/highlight.min.js";
import dollarmath from "./vendor/markdown-it-dollarmath/index.esm.min.js";
import markdownit from "./vendor/markdown-it/markdown-it.esm.min.mjs";
import { tasklist } from "./vendor/mdit-plugin-tasklist/index.js";
import { enhance } from "./markdown_blocks.js";

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const LINK_REL = "noopener noreferrer nofollow";
const LANG = /^[\w+#.-]{1,24}$/;
// what markdown-it and its plugins emit, and nothing else (no id: DOM clobbering; no style: the CSP forbids it)
const PURIFY = {
  ALLOWED_TAGS: ["a", "blockquote", "br", "code", "del", "div", "em", "h3", "h4", "h5", "h6", "hr", "input", "li",
    "ol", "p", "pre", "span", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul"],
  ALLOWED_ATTR: ["checked", "class", "data-display", "data-lang", "disabled", "href", "rel", "start", "target",
    "type"],
  ALLOW_DATA_ATTR: false,
  ALLOWED_URI_REGEXP: /^(?:https?|mailto):/i, // checks every attribute not named below: here, href alone
  ADD_URI_SAFE_ATTR: ["checked", "data-display", "data-lang", "disabled", "rel", "start", "target", "type"],
  RETURN_DOM_FRAGMENT: true,
};

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

const md = markdownit({ html: false, linkify: true, breaks: true, typographer: false });
md.linkify.set({ fuzzyLink: false, fuzzyEmail: false }); // bare URLs need their scheme: "file.py" is no link
md.validateLink = (url) => safeHref(url) !== null;
md.use(tasklist, { label: false, disabled: true });
const texSpan = (tex, { displayMode }) =>
  `<span class="md-tex" data-display="${displayMode}">${md.utils.escapeHtml(tex)}</span>`;
md.use(dollarmath, {
  allow_space: false, // "$5 and $10" is money, not math
  allow_digits: false,
  allow_labels: false,
  renderer: texSpan,
});
// $$...$$ inside a paragraph: a span (the plugin's div would split the paragraph), shown as a display block
md.renderer.rules.math_inline_double = (tokens, idx) =>
  `<span class="math display">${texSpan(tokens[idx].content.trim(), { displayMode: true })}</span>`;
md.core.ruler.push("reply_tags", (state) => {
  for (const token of state.tokens) {
    // a reply sits under the page's headings: # is h3, ## h4 ...
    if (token.type === "heading_open" || token.type === "heading_close") {
      token.tag = "h" + Math.min(6, Number(token.tag.slice(1)) + 2);
    }
    // column alignment as a class: the CSP allows no style attribute
    const align = /text-align:(\w+)/.exec(token.attrGet("style") || "");
    if (align) token.attrs = [["class", "align-" + align[1]]];
    for (const child of token.children || []) {
      if (child.type === "s_open" || child.type === "s_close") child.tag = "del"; // GFM's element for ~~
    }
  }
});

md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
  tokens[idx].attrSet("target", "_blank");
  tokens[idx].attrSet("rel", LINK_REL);
  return self.renderToken(tokens, idx, options);
};
// an image is a link to it, labelled with its alt text: replies load nothing from elsewhere
md.renderer.rules.image = (tokens, idx, options, env, self) => {
  const token = tokens[idx];
  const href = md.utils.escapeHtml(token.attrGet("src"));
  const label = self.renderInlineAsText(token.children || [], options, env) || token.attrGet("src");
  return `<a href="${href}" class="md-image-link" target="_blank" rel="${LINK_REL}">` +
    `${md.utils.escapeHtml(label)}</a>`;
};
md.renderer.rules.table_open = () => '<div class="md-table"><table>\n';
md.renderer.rules.table_close = () => "</table></div>\n";
md.renderer.rules.fence = (tokens, idx) => {
  const token = tokens[idx];
  const lang = token.info.trim().split(/\s+/)[0];
  const code = token.content.replace(/\n$/, "");
  if (!LANG.test(lang)) return `<pre><code>${md.utils.escapeHtml(code)}</code></pre>\n`;
  const known = hljs.getLanguage(lang) !== undefined;
  const body = known ? hljs.highlight(code, { language: lang, ignoreIllegals: true }).value
    : md.utils.escapeHtml(code);
  const name = md.utils.escapeHtml(lang);
  return `<pre data-lang="${name}"><code class="${known ? "hljs " : ""}language-${name}">${body}</code></pre>\n`;
};

/** markdown-it's tokens of `source`; `env` carries link reference definitions from one call to the next. */
export function parse(source, env) {
  return md.parse(source, env);
}

/** Safe nodes for `tokens` (of parse()): rendered to HTML, sanitized, with copy buttons and math added. The
 *  whitespace between top-level blocks is dropped: each child of the fragment is one block. */
export function renderTokens(tokens, env) {
  const fragment = DOMPurify.sanitize(md.renderer.render(tokens, md.options, env), PURIFY);
  for (const node of Array.from(fragment.childNodes)) {
    if (node.nodeType === Node.TEXT_NODE && !node.textContent.trim()) node.remove();
  }
  enhance(fragment);
  return fragment;
}

/** Render Markdown `source` to a DocumentFragment of safe nodes. */
export function render(source) {
  const env = {};
  return renderTokens(parse(String(source == null ? "" : source), env), env);
}
