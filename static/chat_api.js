// The chat page's transport: JSON calls to /api/sessions and the session WebSocket with automatic reconnection.
import { ClientFrame, CloseCode } from "./protocol.js";

const RECONNECT_DELAYS_MS = [250, 500, 1000, 2000, 4000];
const PING_INTERVAL_MS = 25000;

export class ApiError extends Error {
  /** `param`: the request field the server names as the culprit ("settings.temperature"), if any. */
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param || null;
  }
}

/** Accounts: the sign-in ended (signed out elsewhere, password changed): go to the sign-in page. */
function toSignIn() {
  location.assign("/login?error=session_ended&next=" + encodeURIComponent(location.pathname));
}

/** fetch() a JSON endpoint; throws ApiError carrying the server's own message. */
export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "The server cannot be reached. Is it running?");
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch (e) {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    if (response.status === 401 && error.code === "not_signed_in") toSignIn();
    throw new ApiError(response.status, error.message || "HTTP " + response.status, error.param);
  }
  return data;
}

/** One session's socket. Handlers: frame(f), open(isReconnect), drop(), gone(message). */
export class ChatSocket {
  constructor(sessionId, handlers) {
    this.sessionId = sessionId;
    this.handlers = handlers;
    this.ws = null;
    this.closedOnPurpose = false;
    this.attempt = 0;
    this.everOpened = false;
    this.retryTimer = null;
    this.pingTimer = null;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(scheme + "//" + location.host + "/ws/sessions/" + encodeURIComponent(this.sessionId));
    this.ws = ws;
    ws.onopen = () => {
      const reconnect = this.everOpened;
      this.everOpened = true;
      this.attempt = 0;
      this.pingTimer = setInterval(() => this.send({ type: ClientFrame.PING }), PING_INTERVAL_MS);
      this.handlers.open(reconnect);
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      this.handlers.frame(frame);
    };
    ws.onclose = (event) => {
      clearInterval(this.pingTimer);
      if (this.ws !== ws || this.closedOnPurpose) return;
      this.ws = null;
      if (event.code === CloseCode.NOT_SIGNED_IN) {
        toSignIn();
      } else if (event.code === CloseCode.SESSION_NOT_FOUND) {
        this.handlers.gone("This chat no longer exists.");
      } else if (event.code === CloseCode.POLICY_VIOLATION) {
        this.handlers.gone("The server refused the chat connection (reload the page to get a new identity).");
      } else {
        this.handlers.drop();
        const delay = RECONNECT_DELAYS_MS[Math.min(this.attempt, RECONNECT_DELAYS_MS.length - 1)];
        this.attempt++;
        this.retryTimer = setTimeout(() => this.connect(), delay);
      }
    };
  }

  send(frame) {
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  close() {
    this.closedOnPurpose = true;
    clearTimeout(this.retryTimer);
    clearInterval(this.pingTimer);
    if (this.ws) this.ws.close(1000, "leaving the session");
    this.ws = null;
  }
}
