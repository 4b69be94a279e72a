// The account page's API keys: list, make (the key is shown once) and revoke the signed-in account's own keys.
import { call } from "./account_api.js";

const $ = (id) => document.getElementById(id);

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function showError(e) {
  $("keys-error").textContent = e.message;
}

function keyRow(key) {
  const tr = document.createElement("tr");
  tr.dataset.keyId = key.id;
  tr.append(cell(key.name), cell(key.prefix + "…", "mono"), cell(new Date(key.created_at).toLocaleString()));
  const actions = document.createElement("td");
  actions.className = "actions";
  const revoke = document.createElement("button");
  revoke.type = "button";
  revoke.className = "link-btn";
  revoke.textContent = "Revoke";
  revoke.addEventListener("click", async () => {
    if (!confirm(`Revoke the key ${key.name}? What uses it stops at once.`)) return;
    $("keys-error").textContent = $("key-status").textContent = "";
    try {
      const result = await call("DELETE", "/api/keys/" + encodeURIComponent(key.id));
      $("key-status").textContent =
        `Revoked ${key.name}` + (result.ended ? `; ${result.ended} running request(s) ended.` : ".");
      await loadKeys();
    } catch (e) {
      showError(e);
    }
  });
  actions.append(revoke);
  tr.append(actions);
  return tr;
}

async function loadKeys() {
  const data = await call("GET", "/api/keys");
  $("key-rows").replaceChildren(...data.keys.map(keyRow));
  $("keys-empty").hidden = data.keys.length > 0;
}

/** Wire the API keys section of the account page. */
export function initKeys() {
  loadKeys().catch(showError);
  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("keys-error").textContent = $("key-status").textContent = "";
    try {
      const made = await call("POST", "/api/keys", { name: $("key-name").value });
      const result = $("key-result");
      result.textContent = made.key;
      result.hidden = false;
      $("key-status").textContent = `Copy the key ${made.name} now: it is not shown again.`;
      event.target.reset();
      await loadKeys();
    } catch (e) {
      showError(e);
    }
  });
}
