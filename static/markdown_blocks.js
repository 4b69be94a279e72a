// What rendered Markdown gets after sanitizing: a bar with the language and a Copy button on every code block, and
// KaTeX typesetting of $math$ (KaTeX, 600 kB, is imported on the first reply that has math). KaTeX builds its
// nodes itself and sets their inline styles through CSSOM, which the page's CSP (style-src 'self') allows.
const COPIED_MS = 1500;
const KATEX_OPTIONS = {
  throwOnError: true, // a parse error shows the TeX source, marked (KaTeX's error span has a style attribute)
  strict: "ignore",
  trust: false, // no \href, \url, \htmlClass ...
  maxSize: 20,
  maxExpand: 500,
  output: "htmlAndMathml", // MathML for screen readers
};
// the two commands whose MathML KaTeX writes with a style attribute, which the CSP refuses: near equivalents
// (copied for each formula: KaTeX adds a formula's \gdef definitions to the object it is given)
const MACROS = { "\\pmb": "\\boldsymbol{#1}", "\\fcolorbox": "\\@secondoftwo{#1}{\\colorbox{#2}{#3}}" };

let katex = null;
let katexLoading = null;

/** Add code bars and math to the safe nodes under `root` (a fragment or an element). */
export function enhance(root) {
  for (const pre of root.querySelectorAll("pre")) addCodeBar(pre);
  const math = root.querySelectorAll(".md-tex");
  if (!math.length) return;
  if (katex) math.forEach(typeset);
  else mathReady().then(() => document.querySelectorAll(".md-tex:not(.is-typeset)").forEach(typeset), () => {});
}

/** Resolves once KaTeX is loaded (it starts loading on first call); math rendered before then is typeset then. */
export function mathReady() {
  katexLoading ??= import("./vendor/katex/katex.mjs").then(
    (module) => {
      katex = module.default;
    },
    (error) => {
      console.error("KaTeX did not load; math stays as TeX source:", error);
      throw error;
    },
  );
  return katexLoading;
}

function typeset(node) {
  const tex = node.textContent;
  try {
    const displayMode = node.dataset.display === "true";
    katex.render(tex, node, { ...KATEX_OPTIONS, macros: { ...MACROS }, displayMode });
  } catch (error) {
    if (!(error instanceof katex.ParseError)) throw error;
    node.textContent = tex;
    node.classList.add("md-tex-error");
    node.title = error.message;
  }
  node.classList.add("is-typeset");
}

function addCodeBar(pre) {
  const block = document.createElement("div");
  block.className = "code-block";
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const lang = document.createElement("span");
  lang.className = "code-lang";
  lang.textContent = pre.dataset.lang || "";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "code-copy";
  button.textContent = "Copy";
  button.setAttribute("aria-label", "Copy code");
  button.addEventListener("click", () => copyCode(button, pre));
  bar.append(lang, button);
  pre.replaceWith(block);
  block.append(bar, pre);
}

async function copyCode(button, pre) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(pre.textContent);
    copied = true;
  } catch (error) {
    console.warn("copying the code failed:", error);
  }
  button.textContent = copied ? "Copied" : "Copy failed";
  button.setAttribute("aria-label", copied ? "Code copied" : "Copying the code failed");
  button.classList.toggle("is-copied", copied);
  button.classList.toggle("is-failed", !copied);
  clearTimeout(button.resetTimer);
  button.resetTimer = setTimeout(() => {
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy code");
    button.classList.remove("is-copied", "is-failed");
  }, COPIED_MS);
}
