"""How an aborted session reply is labelled: the first reason given wins."""

from __future__ import annotations

from app.chat.reply import Reply
from app.chat.service import ChatService
from app.db import MessageStatus
from app.settings import Settings


class RecordingEngine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def service_with_reply() -> tuple[ChatService, RecordingEngine, Reply]:
    engine = RecordingEngine()
    svc = ChatService(store=None, engine=engine, settings=Settings(), builder=None, fingerprint="test")
    reply = Reply("s1", "r1")
    svc._turns["s1"] = reply
    return svc, engine, reply


def test_the_users_stop_then_the_client_leaving_stays_stopped():
    svc, engine, reply = service_with_reply()
    assert svc.stop("s1") is True
    assert (
        svc.stop_reply(reply, status=MessageStatus.INTERRUPTED) is True
    )  # the SSE response closes after the Stop
    assert (reply.stop_requested, reply.stop_status) == (True, "stopped")
    assert engine.aborted == ["r1", "r1"]


def test_a_client_that_left_is_interrupted_even_when_shutdown_stops_it_later():
    svc, _, reply = service_with_reply()
    assert svc.stop_reply(reply, status=MessageStatus.INTERRUPTED) is True
    assert svc.stop("s1") is True  # server shutdown stops what is still running
    assert reply.stop_status == "interrupted"


def test_stop_reply_never_touches_a_newer_reply_or_an_idle_session():
    svc, engine, old = service_with_reply()
    svc._turns["s1"] = Reply("s1", "r2")  # the session moved on to a new reply
    assert svc.stop_reply(old, status=MessageStatus.INTERRUPTED) is False
    assert svc.stop("other") is False
    assert engine.aborted == []
