// JSON calls of the account pages, and signing out (the server ends the sign-in; the cookie is cleared).

/** fetch() a JSON endpoint of this server; throws an Error carrying the server's own message. */
export async function call(method, path, body) {
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error(data && data.error ? data.error.message : "HTTP " + response.status);
  return data;
}

/** Sign out on the server, then show the sign-in page. */
export async function signOut() {
  await call("POST", "/auth/logout");
  location.assign("/login");
}

/** Wire a "Sign out" button (no-op when the page has none). */
export function bindSignOut(button) {
  if (!button) return;
  button.addEventListener("click", () => signOut().catch((e) => alert("Sign-out failed: " + e.message)));
}
