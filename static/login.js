// The sign-in page: the form posts JSON to /auth/login, then the browser goes where it was headed.
const form = document.getElementById("login-form");
const error = document.getElementById("login-error");
const button = document.getElementById("sign-in");
const next = sameSitePath(new URLSearchParams(location.search).get("next"));

/** `value` when it is a path of this site as the browser reads it (which drops tabs and newlines: `/\t/host` is
 * `//host`), else "/". The server checks `next` too (safe_next in app/accounts/routes.py). */
function sameSitePath(value) {
  if (!value || !value.startsWith("/") || !/^[\x21-\x7e]*$/.test(value) || value.includes("\\")) return "/";
  try {
    const url = new URL(value, location.origin);
    return url.origin === location.origin ? url.pathname + url.search + url.hash : "/";
  } catch (e) {
    return "/";
  }
}

const oidc = document.getElementById("oidc-sign-in");
if (oidc) oidc.href = "/auth/oidc/login?next=" + encodeURIComponent(next);

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.textContent = "";
  button.disabled = true;
  try {
    const response = await fetch("/auth/login", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({
        username: form.username.value,
        password: form.password.value,
        next,
      }),
    });
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      error.textContent = data && data.error ? data.error.message : "Sign-in failed (HTTP " + response.status + ").";
      form.password.select();
      return;
    }
    location.assign(sameSitePath(data.next));
  } catch (e) {
    error.textContent = "The server cannot be reached. Is it running?";
  } finally {
    button.disabled = false;
  }
});
