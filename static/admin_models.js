// The Models card of the admin page (a server serving several models: docs/operators/several-models.md): each
// model's state, what it holds of the memory budget, its KV pool and running requests, with Load and Unload.
// Polled from /api/admin/models; a button posts to /api/admin/models/{id}/load or /unload and shows the answer.
import { formatBytes } from "./admin_tier.js";

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);

/** The page's one byte format (binary units, as the tier and pool figures), "–" for unknown. */
function size(bytes) {
  return bytes == null ? "–" : formatBytes(bytes);
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function button(model, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "btn btn-small";
  b.textContent = action === "load" ? "Load" : "Unload";
  b.dataset.model = model.id;
  b.dataset.action = action;
  b.setAttribute("aria-label", b.textContent + " " + model.id);
  return b;
}

function state(model) {
  const text = model.state.replace("_", " ");
  if (model.loading_seconds != null) return text + " (" + model.loading_seconds.toFixed(1) + " s)";
  return model.error ? text + ": " + model.error : text;
}

function replicas(model) {
  // --replicas: each loaded model is its own replica set
  if (!model.replicas) return "";
  const running = model.replicas.filter((r) => r.state === "running").length;
  return " · " + running + "/" + model.replicas.length + " replicas running";
}

function render(data) {
  $("models-budget").textContent =
    size(data.held_bytes) + " of a " + size(data.budget_bytes) + " budget held" +
    (data.models_max ? " · at most " + data.models_max + " loaded" : "");
  const rows = data.models.map((m) => {
    const tr = document.createElement("tr");
    tr.dataset.model = m.id;
    tr.dataset.state = m.state;
    tr.append(
      cell(m.id + (m.default ? " (default)" : ""), "mono"),
      cell(state(m) + replicas(m)),
      cell(size(m.memory_bytes)),
      cell(size(m.kv_pool_bytes)),
      cell(String(m.running)),
    );
    const actions = document.createElement("td");
    if (!m.default && m.state === "loaded") actions.append(button(m, "unload"));
    if (m.state === "not_loaded" || m.state === "failed") actions.append(button(m, "load"));
    tr.append(actions);
    return tr;
  });
  $("models-rows").replaceChildren(...rows);
}

async function refresh() {
  try {
    const response = await fetch("/api/admin/models", { credentials: "same-origin" });
    if (response.ok) render(await response.json());
  } catch (e) {
    // the feed's banner says when the server cannot be reached
  }
}

async function act(event) {
  const target = event.target.closest("button[data-action]");
  if (!target) return;
  target.disabled = true;
  target.textContent = target.dataset.action === "load" ? "Loading…" : "Unloading…";
  $("models-error").textContent = "";
  const path = "/api/admin/models/" + encodeURIComponent(target.dataset.model) + "/" + target.dataset.action;
  try {
    const response = await fetch(path, { method: "POST", credentials: "same-origin" });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      $("models-error").textContent = (body && body.error && body.error.message) || "HTTP " + response.status;
    }
  } catch (e) {
    $("models-error").textContent = "The server cannot be reached.";
  }
  await refresh();
}

$("models-rows").addEventListener("click", act);
refresh();
setInterval(refresh, POLL_MS);
