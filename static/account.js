// The account page: change the password, API keys, sign out; for admins, the accounts table, invites (made, pending,
// revoked) and new accounts.
import { bindSignOut, call } from "./account_api.js";
import { initKeys } from "./account_keys.js";

const $ = (id) => document.getElementById(id);
const isAdmin = document.querySelector("main").dataset.admin === "true";

bindSignOut($("sign-out"));
initKeys();

const passwordForm = $("password-form");
if (passwordForm) {
  passwordForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    $("password-error").textContent = $("password-status").textContent = "";
    try {
      await call("POST", "/auth/password", {
        current_password: passwordForm.current.value,
        new_password: passwordForm.changed.value,
      });
      passwordForm.reset();
      $("password-status").textContent = "Password changed; your other devices are signed out.";
    } catch (e) {
      $("password-error").textContent = e.message;
    }
  });
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function actionButton(label, handler) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "link-btn";
  button.textContent = label;
  button.addEventListener("click", () => handler().then(loadAdmin).catch(showUsersError));
  return button;
}

function showUsersError(e) {
  $("users-error").textContent = e.message;
}

function userRow(user) {
  const tr = document.createElement("tr");
  tr.dataset.username = user.username;
  const signIn = [user.password ? "password" : "", user.oidc ? "provider" : ""].filter(Boolean).join(", ");
  tr.append(cell(user.username), cell(user.role), cell(signIn || "—"), cell(user.disabled ? "disabled" : "active"));
  const actions = document.createElement("td");
  actions.className = "actions";
  const path = "/api/users/" + encodeURIComponent(user.id);
  actions.append(
    actionButton(user.disabled ? "Enable" : "Disable", () => call("PATCH", path, { disabled: !user.disabled })),
    actionButton(user.role === "admin" ? "Make user" : "Make admin", () =>
      call("PATCH", path, { role: user.role === "admin" ? "user" : "admin" }),
    ),
    actionButton("Delete", async () => {
      if (!confirm(`Delete ${user.username} and all their chats? This cannot be undone.`)) return;
      await call("DELETE", path);
    }),
  );
  tr.append(actions);
  return tr;
}

async function loadUsers() {
  $("users-error").textContent = "";
  const data = await call("GET", "/api/users");
  $("user-rows").replaceChildren(...data.users.map(userRow));
}

function inviteRow(invite) {
  const tr = document.createElement("tr");
  tr.dataset.username = invite.username;
  tr.append(
    cell(invite.username),
    cell(invite.role),
    cell(invite.created_by || "—"),
    cell(new Date(invite.expires_at).toLocaleString()),
  );
  const actions = document.createElement("td");
  actions.className = "actions";
  actions.append(
    actionButton("Revoke", () => call("DELETE", "/api/users/invites/" + encodeURIComponent(invite.id))),
  );
  tr.append(actions);
  return tr;
}

// pending invites: a demotion, a disable or a deletion takes the invites of that admin with it
async function loadInvites() {
  const data = await call("GET", "/api/users/invites");
  $("invite-rows").replaceChildren(...data.invites.map(inviteRow));
  $("invites-empty").hidden = data.invites.length > 0;
}

async function loadAdmin() {
  await loadUsers();
  await loadInvites();
}

if (isAdmin) {
  loadAdmin().catch(showUsersError);
  $("invite-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("users-error").textContent = "";
    try {
      const invite = await call("POST", "/api/users/invites", {
        username: $("invite-username").value,
        role: $("invite-role").value,
      });
      const result = $("invite-result");
      result.textContent = location.origin + invite.path;
      result.hidden = false;
      $("admin-status").textContent = `Send this link to ${invite.username}; it works once, until ${new Date(
        invite.expires_at,
      ).toLocaleString()}.`;
      event.target.reset();
      await loadInvites();
    } catch (e) {
      showUsersError(e);
    }
  });
  $("create-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("users-error").textContent = "";
    try {
      const created = await call("POST", "/api/users", {
        username: $("create-username").value,
        password: $("create-password").value,
        role: $("create-role").value,
      });
      $("admin-status").textContent = `Created ${created.user.username}.`;
      event.target.reset();
      await loadUsers();
    } catch (e) {
      showUsersError(e);
    }
  });
}
