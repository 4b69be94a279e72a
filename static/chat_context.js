// Room in the context, checked before a message goes out (POST …/plan; app/chat/truncation.py). A message that
// cannot fit is refused at the composer with what to do; a history that must be cut is never cut silently: the
// composer offers the choices (drop the oldest turns, keep the attachments, a new chat from a summary) and the
// message stays in the composer until one is taken. The server refuses the same way (409 `context_full`,
// 400 `prompt_too_long`) if anything changed in between.
import { api } from "./chat_api.js";
import { queueMessage, replyOnShowId } from "./chat_outbox.js";
import { autoGrow, showError } from "./chat_render.js";
import { openSession } from "./chat_sessions.js";
import { state, ui } from "./chat_state.js";
import * as view from "./chat_view.js";

export const CONTEXT_CODES = ["context_full", "prompt_too_long"];
// a long paste is checked while it sits in the composer (after a pause in typing), so a document that cannot fit
// says so before Send
const CHECK_WHILE_TYPING_CHARS = 2000;
const CHECK_DELAY_MS = 600;
let checkTimer = null;
const CHOICES = {
  oldest: "Drop the oldest turns",
  keep_pinned: "Keep the attachments, drop other turns",
  summary: "New chat from a summary",
};

/** Send `text` once the server says it fits; else show what to do (the text stays in the composer). */
export async function sendPlanned(text) {
  let report;
  try {
    const parent = replyOnShowId();
    report = await api("POST", sessionPath("/plan"), parent ? { content: text, parent_id: parent } : { content: text });
  } catch (e) {
    if (e.status === 0) {
      queueMessage(text); // the server cannot be reached: the message waits in the outbox, checked when it goes
      return;
    }
    showNotice(e.message);
    return;
  }
  if (report.fits) {
    clearContextNotice();
    queueMessage(text);
  } else {
    showContext(report, text);
  }
}

/** The composer changed: a long text is checked after a pause; advice about other text goes. */
export function composerChanged() {
  clearTimeout(checkTimer);
  if (ui.composerNotice.dataset.kind === "too-long" || ui.composerNotice.dataset.kind === "choice") {
    clearContextNotice(); // it was about other text
  }
  const text = ui.input.value;
  if (text.length < CHECK_WHILE_TYPING_CHARS || !state.current || state.streaming) return;
  checkTimer = setTimeout(async () => {
    let report;
    try {
      const parent = replyOnShowId();
      report = await api("POST", sessionPath("/plan"), parent ? { content: text, parent_id: parent } : { content: text });
    } catch (e) {
      return; // Send says what is wrong
    }
    // only a message that cannot fit at all is shown now; the choice of what to leave out waits for Send
    if (ui.input.value === text && !report.fits && !report.options.length) showContext(report, text);
  }, CHECK_DELAY_MS);
}

/** The server's word on a message that does not fit as it stands: its advice, and the choices it offers.
 * `resend(extra)`: for a regenerate, edit or continue refused so (it goes again with `truncate`; no summary). */
export function showContext(report, text, resend) {
  const options = report.options.filter((o) => CHOICES[o] && !(resend && o === "summary"));
  const box = showNotice(options.length ? choiceText(report) : report.advice);
  box.dataset.kind = options.length ? "choice" : "too-long";
  if (!options.length) return;
  const row = view.el("div", "row composer-choices");
  for (const option of options) {
    const b = view.el("button", "btn btn-small" + (option === "oldest" ? " btn-primary" : ""), CHOICES[option]);
    b.type = "button";
    b.dataset.choice = option;
    b.addEventListener("click", () => {
      if (!resend) return choose(option, text);
      clearContextNotice();
      return resend({ truncate: option });
    });
    row.append(b);
  }
  const cancel = view.el("button", "btn btn-small", "Cancel");
  cancel.type = "button";
  cancel.dataset.choice = "cancel";
  cancel.addEventListener("click", () => {
    clearContextNotice();
    ui.input.focus();
  });
  row.append(cancel);
  box.append(row);
  row.querySelector("button").focus();
}

export function clearContextNotice() {
  ui.composerNotice.hidden = true;
  ui.composerNotice.replaceChildren();
  delete ui.composerNotice.dataset.kind;
}

async function choose(option, text) {
  clearContextNotice();
  if (option !== "summary") {
    queueMessage(text, { truncate: option });
    return;
  }
  const box = showNotice("Writing a summary of this chat for a new one…");
  box.dataset.kind = "summarizing";
  try {
    const made = await api("POST", sessionPath("/summarize"), {});
    state.sessions.unshift(made.session);
    await openSession(made.session.id);
    clearContextNotice();
    ui.input.value = text;
    autoGrow();
    await sendPlanned(text);
  } catch (e) {
    clearContextNotice();
    showError(e.message, e.status === 0 ? "connection" : "");
  }
}

/** The choice in the page's words (the server's advice names the API's `truncate` values). */
function choiceText(report) {
  const n = report.truncated_turns;
  const pinned = report.pinned_turns_dropped;
  return "This chat no longer fits the model's context (" + report.prompt_tokens + " tokens + " + report.max_tokens +
    " for the reply > " + report.max_model_len + "): to send this message, " + n + " earlier exchange" +
    (n === 1 ? "" : "s") + " must be left out" + (pinned ? ", " + pinned + " of them with attachments" : "") +
    ". Nothing is left out until you choose:";
}

function showNotice(message) {
  const box = ui.composerNotice;
  box.replaceChildren(view.el("p", "composer-advice", message));
  box.hidden = false;
  return box;
}

function sessionPath(tail) {
  return "/api/sessions/" + encodeURIComponent(state.current.id) + tail;
}
