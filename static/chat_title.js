// A new chat's title, from its first message: a short message's first line; a long one (a pasted document and a
// question about it) is named by its question, not by the paste's first line ("Here is a document:").

const MAX_TITLE_CHARS = 48;
const SHORT_MESSAGE_CHARS = 200; // up to this long and SHORT_MESSAGE_LINES lines: the first line, as typed
const SHORT_MESSAGE_LINES = 3;
const MAX_QUESTION_CHARS = 300; // a last paragraph longer than this is part of the paste, not the question

/** Sentences of a paragraph: split after . ? ! and at line breaks. */
function sentencesOf(paragraph) {
  return paragraph.split(/(?<=[.?!])\s+|\n+/).map((s) => s.trim()).filter(Boolean);
}

/** The question of a long message: its last paragraph when that is short (or else its last line, when that is a
 * short question): the last sentence there ending in '?', else its first sentence; null when neither is short. */
function questionOf(text) {
  const paragraphs = text.split(/\n\s*\n/).map((p) => p.trim()).filter(Boolean);
  const lines = text.split("\n").map((l) => l.trim()).filter(Boolean);
  const lastParagraph = paragraphs[paragraphs.length - 1] || "";
  const lastLine = lines[lines.length - 1] || "";
  let asked = null;
  if (paragraphs.length > 1 && lastParagraph.length <= MAX_QUESTION_CHARS) asked = lastParagraph;
  else if (lastLine.endsWith("?") && lastLine.length <= MAX_QUESTION_CHARS) asked = lastLine;
  if (asked === null) return null;
  const sentences = sentencesOf(asked);
  return sentences.filter((s) => s.endsWith("?")).pop() || sentences[0];
}

/** A session title from a first message ("" when it has no words). */
export function titleFrom(text) {
  const trimmed = text.trim();
  const lines = trimmed.split("\n");
  const short = trimmed.length <= SHORT_MESSAGE_CHARS && lines.length <= SHORT_MESSAGE_LINES;
  const picked = (short ? null : questionOf(trimmed)) || lines[0];
  const line = picked.replace(/\s+/g, " ").trim();
  return line.length > MAX_TITLE_CHARS ? line.slice(0, MAX_TITLE_CHARS - 1) + "…" : line;
}
