"""WS /ws/sessions/{id}: the browser's chat socket. Frames are JSON text; bad input gets an error frame, not a close.

Client → server: {"type": "message", "content": str, "parent_id"?: int | null, "attachments"?: [int]} ·
{"type": "regenerate", "message_id"?: int} · {"type": "edit", "content": str, "message_id"?: int,
"attachments"?: [int]} · {"type": "continue", "message_id"?: int}
(each of the four may say `"truncate": "oldest" | "keep_pinned"`: what to leave out when the history does not fit;
without it such a turn gets error 409 `context_full` with `context` {…, options, advice}, app/chat/truncation.py)
· {"type": "branch", "message_id": int} · {"type": "stop"} · {"type": "ping"}. A turn without its id extends the
active leaf (app/chat/branches.py).
Server → client: start {mode, user_message, ...} · assistant_start {message_id, parent_id, sibling_ids,
sibling_index, continues} · delta {text} · done {message, usage, timings, reason?} · branch {active_leaf_id,
messages} · error {status, code, message, param} · stop_ack {stopped} · pong.

With accounts on, a socket without a sign-in gets an error frame (code `not_signed_in`) and closes with 4401; so does
a socket whose sign-in (or per-user API key) ended while it was open (sign-out elsewhere, a password change, a
disabled or deleted account): within `credential_check_interval_s`, idle or mid-reply (the reply is stopped, stored
as interrupted), and at once at a reply frame (app/http/credentials.py).

At shutdown, once the grace period is over, a running reply ends with its `done` (reason `shutdown`), then an error
frame with code `server_shutdown` says why, and the socket closes with 1001 (going away).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.chat.branches import turn_target
from app.chat.reply import Reply
from app.chat.service import ChatService, ReplyMode, chat_of
from app.chat.truncation import truncate_value
from app.db import MessageStatus
from app.http.credentials import Credential, credential_alive, credential_of, revoked_error, until_revoked
from app.http.errors import APIError, bad_request, from_exception
from app.http.identity import REVOKED
from app.http.key_auth import end_with_key
from app.http.params import check_unicode
from app.http.security import origin_allowed, session_owner
from app.http.services import Services, services
from app.http.shutdown import END_WAIT_S

logger = logging.getLogger(__name__)
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_NOT_SIGNED_IN = 4401  # accounts: the socket's sign-in is missing or ended
CLOSE_SESSION_NOT_FOUND = 4404
# a revoked socket's loop ends once the client answers its close, after the reply's abort (up to 5 s)
SERVE_END_WAIT_S = 10.0
REPLY_FRAMES = {
    "message": ReplyMode.SEND,
    "regenerate": ReplyMode.REGENERATE,
    "edit": ReplyMode.EDIT,
    "continue": ReplyMode.CONTINUE,
}


def error_frame(error: APIError) -> dict[str, Any]:
    """An error as a socket frame: the HTTP error body's fields (its `type` as `error_type`) and the status."""
    body = error.to_dict()["error"]
    return {
        "type": "error",
        "status": error.status,
        "error_type": body["type"],
        "message": body["message"],
        "param": body["param"],
        "code": body["code"],
        **error.extra,
    }


class _Socket:
    """Serialises sends: replies are forwarded by a task while the main loop answers other frames.

    A send that the client does not take within `send_timeout_s` (a stalled reader) raises TimeoutError.
    """

    def __init__(self, websocket: WebSocket, send_timeout_s: float) -> None:
        self.websocket = websocket
        self.lock = asyncio.Lock()
        self.send_timeout_s = send_timeout_s
        self.pump: asyncio.Task | None = None  # forwards the running reply's events
        self.signed_out = False  # the not_signed_in frame and 4401 went (once, whoever noticed first)

    async def send(self, frame: dict[str, Any]) -> None:
        async with self.lock:
            text = json.dumps(frame, ensure_ascii=False)
            await asyncio.wait_for(self.websocket.send_text(text), self.send_timeout_s)

    async def close_not_signed_in(self, error: APIError) -> None:
        """The error frame saying the sign-in is gone, then a close with 4401 (once; a gone client is no error)."""
        if self.signed_out:
            return
        self.signed_out = True
        with contextlib.suppress(Exception):
            await self.send(error_frame(error))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.websocket.close(code=CLOSE_NOT_SIGNED_IN, reason="not signed in"), self.send_timeout_s
            )


async def chat_socket(websocket: WebSocket) -> None:
    """One browser tab's chat on one session."""
    svc = services(websocket)
    session_id = websocket.path_params["session_id"]
    if not origin_allowed(websocket, svc.settings):
        logger.warning("websocket rejected: origin %r", websocket.headers.get("origin"))
        await websocket.close(code=CLOSE_POLICY_VIOLATION)  # before accept: the handshake gets 403
        return
    try:
        owner = session_owner(websocket, svc.settings)
    except APIError as exc:
        if exc.code == "not_signed_in":  # accounts: say why, so that the page can go to the sign-in page
            await websocket.accept()
            await websocket.send_text(json.dumps(error_frame(exc)))
            await websocket.close(code=CLOSE_NOT_SIGNED_IN, reason="not signed in")
        else:  # no browser cookie (policy), or the sign-in could not be checked (the database is down)
            await websocket.close(code=CLOSE_TRY_AGAIN_LATER if exc.status == 503 else CLOSE_POLICY_VIOLATION)
        return
    await websocket.accept()
    socket = _Socket(websocket, svc.settings.slow_reader_timeout_s)
    try:
        session = await svc.store.chats.get_session(owner, session_id)
    except Exception as exc:  # noqa: BLE001 - the store is down: say so and close
        await socket.send(error_frame(from_exception(exc)))
        await websocket.close(code=CLOSE_TRY_AGAIN_LATER)
        return
    if session is None:
        await socket.send(
            error_frame(APIError(404, f"session {session_id[:64]!r} not found", code="not_found"))
        )
        await websocket.close(code=CLOSE_SESSION_NOT_FOUND)
        return
    credential = await credential_of(websocket, svc, owner=owner)
    await _serve_until_shutdown(socket, svc, owner, session_id, credential)


def _end_with_key(websocket: WebSocket, svc: Services, reply: Reply) -> None:
    """A socket opened with an API key: its reply stops (stored as interrupted) when the key is revoked."""
    end_with_key(
        websocket,
        svc,
        lambda: reply.task is not None and not reply.task.done(),
        lambda: chat_of(svc).stop_reply(reply, MessageStatus.INTERRUPTED, reason=REVOKED),
    )


async def _serve_until_shutdown(
    socket: _Socket, svc: Services, owner: str, session_id: str, credential: Credential
) -> None:
    """Serve the socket; once its credential is gone, close it with 4401 (its reply aborted as at a disconnect);
    at the end of a shutdown's grace period, finish it: the reply's `done`, a frame saying why, and a close with
    1001."""
    serving = asyncio.ensure_future(_serve(socket, svc, owner, session_id, credential))
    closing = asyncio.ensure_future(svc.shutdown.closing.wait())
    revoked = (
        asyncio.ensure_future(until_revoked(socket.websocket, svc, credential))
        if credential.revocable
        else None
    )
    try:
        waits = {serving, closing} if revoked is None else {serving, closing, revoked}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            return serving.result()
        if not closing.done():  # the credential is gone (or its check failed: a bug, and the socket ends)
            assert revoked is not None and revoked.done(), "one of the three ended"
            if revoked.exception() is not None:
                logger.error("a chat socket's credential check failed: closed", exc_info=revoked.exception())
            await socket.close_not_signed_in(revoked_error("this chat"))
            # its loop sees the close as a disconnect and aborts the reply (stored as interrupted)
            await asyncio.wait({serving}, timeout=SERVE_END_WAIT_S)
            return
        if socket.pump is not None:  # the shutdown has cut the reply: its done comes once it is stored
            await asyncio.wait({socket.pump}, timeout=END_WAIT_S)
        serving.cancel()  # no more frames from the client
        with contextlib.suppress(Exception):  # a client that takes nothing does not hold the shutdown up
            await asyncio.wait_for(_say_goodbye(socket), END_WAIT_S)
    finally:
        closing.cancel()
        serving.cancel()
        if revoked is not None:
            revoked.cancel()


async def _say_goodbye(socket: _Socket) -> None:
    message = "the server is shutting down: this connection closes now; reconnect in a moment"
    shutdown = APIError(503, message, code="server_shutdown", error_type="server_shutdown")
    await socket.send(error_frame(shutdown))
    await socket.websocket.close(code=CLOSE_GOING_AWAY, reason="server shutting down")


async def _serve(socket: _Socket, svc: Services, owner: str, session_id: str, credential: Credential) -> None:
    chat, max_frame_bytes = chat_of(svc), svc.settings.ws_max_frame_bytes
    starting: asyncio.Task | None = None  # the latest turn's setup
    try:
        while True:
            message = await socket.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await socket.send(error_frame(bad_request("binary frames are not supported: send JSON text")))
                continue
            if len(text) > max_frame_bytes or len(text.encode("utf-8", "surrogatepass")) > max_frame_bytes:
                await socket.websocket.close(code=CLOSE_TOO_BIG, reason=f"frame over {max_frame_bytes} bytes")
                return
            try:
                frame = _parse(text)
                kind = frame["type"]
                if starting is not None and not starting.done() and kind not in ("ping", "stop"):
                    await asyncio.wait([starting])  # frames after a turn are answered once it has started
                if kind == "ping":
                    await socket.send({"type": "pong"})
                elif kind == "stop":
                    if starting is not None and not starting.done() and chat.waiting_for_model(session_id):
                        starting.cancel()  # its model is still loading: the turn ends before it began
                        stopped = True
                    else:
                        if starting is not None:  # a turn being set up: stopped once it has started
                            await asyncio.wait([starting])
                        stopped = chat.stop(session_id)
                    await socket.send({"type": "stop_ack", "stopped": stopped})
                elif kind == "branch":
                    await _check_signed_in(socket, svc, credential)
                    await socket.send(
                        {"type": "branch", **await chat.switch_branch(owner, session_id, frame)}
                    )
                elif kind in REPLY_FRAMES:
                    # signed out since the socket opened (elsewhere, a password change, disabled): 401
                    await _check_signed_in(socket, svc, credential)
                    mode = REPLY_FRAMES[kind]
                    target = turn_target(mode, frame)
                    truncate_value(frame)  # a bad value is a 400 before the client's slot is taken
                    # shutting down (503) or over a client limit (429)
                    lease = svc.admission.admit(socket.websocket, owner)
                    # set up in a task: while the chat's model loads (seconds), frames are still read, and a Stop
                    # cancels the turn
                    starting = asyncio.create_task(
                        _start_reply(socket, svc, chat, owner, session_id, mode, target, frame, lease)
                    )
                else:
                    raise bad_request(
                        f"unknown frame type {kind[:40]!r}: expected message, stop, regenerate, edit, continue, "
                        "branch or ping",
                        "type",
                    )
            except WebSocketDisconnect:
                raise
            except Exception as exc:  # noqa: BLE001 - bad input or a busy session: an error frame, socket stays open
                if not await _report(socket, exc):
                    return
    except WebSocketDisconnect:
        return
    finally:
        if starting is not None and not starting.done():
            if chat.waiting_for_model(session_id):
                starting.cancel()  # the tab went away while its turn waited for its model
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting  # otherwise it starts, and is stopped below as any running reply
        # The tab went away mid-reply: abort it (stored as interrupted). Not once the shutdown closes the socket:
        # the shutdown has cut the reply already.
        pump = socket.pump
        if pump is not None and not pump.done() and not svc.shutdown.closing.is_set():
            chat.stop(session_id, status=MessageStatus.INTERRUPTED)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(pump, timeout=5.0)


async def _start_reply(
    socket: _Socket,
    svc: Services,
    chat: ChatService,
    owner: str,
    session_id: str,
    mode: ReplyMode,
    target: Any,
    frame: dict[str, Any],
    lease: Any,
) -> None:
    """Start the turn and its pump; a failure (or a Stop while its model loads) is an error frame."""
    try:
        reply = await chat.start(
            mode,
            owner,
            session_id,
            frame.get("content"),
            lease,
            target=target,
            truncate=truncate_value(frame),
            attachments=frame.get("attachments"),
        )
    except asyncio.CancelledError:
        stopped = APIError(
            409,
            "stopped before the reply began: its model was still loading; nothing was stored",
            code="stopped_before_start",
        )
        with contextlib.suppress(Exception):
            await socket.send(error_frame(stopped))
        return
    except Exception as exc:  # noqa: BLE001 - bad input or a busy session: an error frame, socket stays open
        await _report(socket, exc)
        return
    _end_with_key(socket.websocket, svc, reply)
    socket.pump = asyncio.create_task(_forward(socket, chat, reply))


async def _report(socket: _Socket, exc: Exception) -> bool:
    """`exc` as an error frame (the socket stays open); False when the socket is done: signed out (closed with
    4401) or the client gone (a send on a closed socket raises)."""
    error = from_exception(exc)
    if error.code == "not_signed_in":
        await socket.close_not_signed_in(error)
        return False
    try:
        await socket.send(error_frame(error))
    except Exception:  # noqa: BLE001 - the client is gone
        return False
    return True


async def _check_signed_in(socket: _Socket, svc: Services, credential: Credential) -> None:
    """Before a turn: 401 when the socket's sign-in has ended (looked up now, not the last interval's answer)."""
    if credential.revocable and not await credential_alive(socket.websocket, svc, credential, fresh=True):
        raise revoked_error("this chat")


def _parse(text: str) -> dict[str, Any]:
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"frame is not valid JSON: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise bad_request("frame must be a JSON object with a string 'type'", "type")
    check_unicode(frame, "frame")
    return frame


async def _forward(socket: _Socket, chat: ChatService, reply: Reply) -> None:
    """Send the reply's events to the socket (events keep coming even if sends fail: the reply must end)."""
    stalled = False
    async for event in reply.iter_events():
        if stalled:
            continue
        try:
            await socket.send(event)
        except asyncio.TimeoutError:  # the client stopped reading: drop it and stop its reply (interrupted)
            stalled = True
            logger.warning("websocket reader stalled for %g s: closing it", socket.send_timeout_s)
            chat.stop(reply.session_id, status=MessageStatus.INTERRUPTED)
            with contextlib.suppress(Exception):
                await socket.websocket.close(code=CLOSE_TRY_AGAIN_LATER, reason="reader too slow")
        except Exception:  # noqa: BLE001 - the socket closed; the reply still runs to its stored end
            continue


routes = [WebSocketRoute("/ws/sessions/{session_id}", chat_socket)]
