// Conversation branches on the chat page: the "‹ 2/3 ›" switch between the versions of a message (regenerated
// replies, edited messages) and Continue on a reply that stopped at its token limit. Edit and Regenerate, which
// start the branches, are in chat_turns.js.
import { api } from "./chat_api.js";
import { clearError, renderConversation, showError } from "./chat_render.js";
import { state, ui } from "./chat_state.js";
import { aboutNode, beginTurn } from "./chat_turns.js";
import { ClientFrame } from "./protocol.js";

/** Show another version of the message `node` (`step` -1 or +1): the branch through it, at its newest turn. */
export async function switchVersion(node, step) {
  const nav = node.querySelector(".msg-versions");
  if (!nav || state.streaming || !state.current) return;
  const ids = nav.dataset.siblingIds.split(",").map(Number);
  const target = ids[Number(nav.dataset.index) + step];
  if (target === undefined) return;
  const top = node.getBoundingClientRect().top;
  if (!(await showBranchThrough(target))) return;
  // the switched message stays where it was on screen, its control under the pointer
  const again = ui.messages.querySelector('.msg[data-id="' + target + '"]');
  if (again) {
    ui.messages.scrollTop += again.getBoundingClientRect().top - top;
    const buttons = Array.from(again.querySelectorAll(".version-btn")).filter((b) => !b.disabled);
    const same = buttons.find((b) => b.dataset.action === (step < 0 ? "version-prev" : "version-next"));
    if (same || buttons[0]) (same || buttons[0]).focus();
  }
}

/** Make the branch through the message `messageId` (at its newest turn) the one on show, on the server and on the
 * page (a version switch, a search hit on another branch); false when it was not switched (the error is shown). */
export async function showBranchThrough(messageId) {
  if (!state.current || state.streaming) return false;
  const sessionId = state.current.id;
  let shown;
  try {
    shown = await api("POST", "/api/sessions/" + encodeURIComponent(sessionId) + "/branch", { message_id: messageId });
  } catch (e) {
    showError(e.message, e.status === 0 ? "connection" : "");
    return false;
  }
  if (!state.current || state.current.id !== sessionId || state.streaming) return false;
  clearError();
  Object.assign(state.current, shown);
  renderConversation(shown.messages);
  return true;
}

/** Extend the reply `node` where it stopped; its bubble grows. */
export function continueReply(node) {
  return beginTurn(aboutNode({ type: ClientFrame.CONTINUE }, node), null);
}

function onClick(event) {
  const target = event.target.closest("[data-action]");
  const node = target && target.closest(".msg");
  if (!node || state.streaming) return;
  const action = target.dataset.action;
  if (action === "version-prev") switchVersion(node, -1);
  else if (action === "version-next") switchVersion(node, 1);
  else if (action === "continue") continueReply(node);
}

export function bindBranchEvents() {
  ui.messages.addEventListener("click", onClick);
}
