// The invite page: the token is the URL's fragment (never sent to a server log); the invitee sets a password.
const token = decodeURIComponent(location.hash.slice(1));
const form = document.getElementById("invite-form");
const intro = document.getElementById("invite-for");
const error = document.getElementById("invite-error");

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error(data && data.error ? data.error.message : "HTTP " + response.status);
  return data;
}

async function start() {
  if (!token) {
    intro.textContent = "";
    error.textContent = "This page needs the whole invite link, with its part after '#'.";
    return;
  }
  try {
    const invite = await post("/auth/invite", { token });
    intro.textContent = `You are invited as ${invite.username}. The link works once, until ${new Date(
      invite.expires_at,
    ).toLocaleString()}.`;
    form.hidden = false;
    form.password.focus();
  } catch (e) {
    intro.textContent = "";
    error.textContent = e.message;
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.textContent = "";
  if (form.password.value !== form.repeat.value) {
    error.textContent = "The two passwords differ.";
    return;
  }
  try {
    await post("/auth/invite/accept", { token, password: form.password.value });
    history.replaceState(null, "", "/invite");
    location.assign("/");
  } catch (e) {
    error.textContent = e.message;
  }
});

start();
