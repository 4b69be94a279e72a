// The live sequences table: one row per sequence, who it is for (a chat's title and browser, an API call's key and
// user, as the service labelled it), its prefix-cache hit and sizes; picking a row outlines its blocks on the map.
import { state } from "./admin_state.js";

const COLUMNS = ["seq", "who", "num", "num", "num"]; // seq and its status, who, prefix hit, tokens, blocks

/** [what, who]: ["Chat “Title”", "alice"], ["API chat completion", "API key 3f2a9c1b"]; the request
 * id where the service gave no label. */
export function whoText(seq) {
  const label = seq.label;
  if (!label) return [seq.request_id.slice(0, 22), "unlabelled request"];
  return [label.source === "chat" ? "Chat “" + label.title + "”" : "API " + label.title, label.owner];
}

/** "96/120 (80%)": prompt tokens served from the prefix cache at admission; "–" before admission. */
export function prefixHitText(seq) {
  if (seq.status === "waiting" || !seq.num_prompt_tokens) return "–";
  const share = Math.round((100 * seq.num_cached_tokens) / seq.num_prompt_tokens);
  return seq.num_cached_tokens + "/" + seq.num_prompt_tokens + " (" + share + "%)";
}

// Rows are keyed by sequence and updated in place, so a row's button stays put (and clickable) while the
// feed updates its numbers several times a second.
const rows = new Map(); // seq_id -> { tr, pick, tds }

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function sequenceRow(seqId) {
  let row = rows.get(seqId);
  if (row) return row;
  const tr = document.createElement("tr");
  tr.dataset.seqId = String(seqId);
  const pick = document.createElement("button");
  pick.type = "button";
  pick.className = "link-btn";
  pick.textContent = "#" + seqId;
  pick.setAttribute("aria-label", "Highlight the blocks of sequence " + seqId);
  pick.addEventListener("click", () => select(seqId === state.selected ? null : seqId));
  const tds = COLUMNS.map((className) => {
    const td = document.createElement("td");
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  });
  const status = document.createElement("span");
  status.className = "seq-status";
  tds[0].append(pick, status);
  const what = document.createElement("span");
  what.className = "who-what";
  const owner = document.createElement("span");
  owner.className = "who-owner";
  tds[1].append(what, owner);
  tr.addEventListener("click", (e) => {
    if (e.target.tagName !== "BUTTON") pick.click();
  });
  row = { tr, pick, tds, status, what, owner };
  rows.set(seqId, row);
  return row;
}

export function renderSequences(sequences) {
  const json = JSON.stringify(sequences) + "|" + state.selected;
  if (json === state.seqsJson) return;
  state.seqsJson = json;
  setText(document.getElementById("seqs-count"), sequences.length ? sequences.length + " live" : "");
  const body = document.getElementById("seq-rows");
  const live = new Set(sequences.map((seq) => seq.seq_id));
  for (const [seqId, row] of rows) {
    if (!live.has(seqId)) {
      row.tr.remove();
      rows.delete(seqId);
    }
  }
  if (!sequences.length) {
    const td = document.createElement("td");
    td.colSpan = COLUMNS.length;
    td.className = "muted";
    td.textContent = "No live sequences.";
    const tr = document.createElement("tr");
    tr.appendChild(td);
    body.replaceChildren(tr);
    return;
  }
  for (const child of Array.from(body.children)) {
    if (!child.dataset.seqId) child.remove(); // the "No live sequences." placeholder
  }
  let previous = null;
  for (const seq of sequences) {
    const row = sequenceRow(seq.seq_id);
    const selected = seq.seq_id === state.selected;
    row.tr.className = selected ? "is-selected" : "";
    row.pick.setAttribute("aria-pressed", String(selected));
    const [what, owner] = whoText(seq);
    setText(row.what, what);
    setText(row.owner, owner);
    row.tds[1].title = what + " · " + owner + " · request " + seq.request_id;
    setText(row.status, seq.status);
    row.status.dataset.status = seq.status; // "loading": its prefix is being read from the disk tier
    setText(row.tds[2], prefixHitText(seq));
    setText(row.tds[3], String(seq.num_tokens));
    setText(row.tds[4], String(seq.num_blocks));
    const expected = previous ? previous.nextSibling : body.firstChild;
    if (expected !== row.tr) body.insertBefore(row.tr, expected); // moves only rows out of order
    previous = row.tr;
  }
}

/** Outline sequence `seqId`'s blocks on the map (the feed marks them: a new view) and mark its row (null: none). */
export function select(seqId) {
  if (seqId === state.selected) return;
  state.selected = seqId;
  state.setView(Object.assign({}, state.view, { seq: seqId }));
  state.seqsJson = "";
  if (state.lastPool) renderSequences(state.lastPool.sequences);
}
