"""bench/common/conversations.py: `bench multiturn` arrivals, staggered users keeping the load steady around their
measured conversations."""

from __future__ import annotations

import asyncio
import itertools

from bench.common import session_client as sc
from bench.common.conversations import Latch, run_user
from bench.common.workload import user_turns

SEED = 0


class FakeConversation:
    """Appends (user, conversation number, message) to a shared log for every message sent (no server)."""

    numbers = itertools.count()

    def __init__(self, log: list[tuple[int, int, str]], user: int) -> None:
        self.log, self.user, self.number = log, user, next(self.numbers)

    async def send(self, content: str) -> sc.TurnResult:
        self.log.append((self.user, self.number, content))
        # a turn takes time, so users finish their measured conversations in order of lead-in
        await asyncio.sleep(0.002)
        return sc.TurnResult(ok=True, text=content)


def run_users(num_users: int, turns: int, staggered: bool):
    """Each user's returned results and everything it sent, as [(conversation number, message)]."""
    log: list[tuple[int, int, str]] = []
    latch = Latch(num_users)

    async def users() -> list[list[sc.TurnResult]]:
        async def start(u: int) -> FakeConversation:
            return FakeConversation(log, u)

        return await asyncio.gather(
            *(
                run_user(u, lambda u=u: start(u), user_turns(u, turns, SEED), staggered, latch, lambda: None)
                for u in range(num_users)
            )
        )

    results = asyncio.run(users())
    sent = [[(n, c) for v, n, c in log if v == u] for u in range(num_users)]
    return results, sent


def test_together_sends_only_the_measured_conversations():
    results, sent = run_users(3, 4, staggered=False)
    for u in range(3):
        assert [r.text for r in results[u]] == user_turns(u, 4, SEED)
        assert [c for _, c in sent[u]] == user_turns(u, 4, SEED)


def test_staggered_users_lead_in_by_their_index_mod_turns_and_stay_busy_until_all_are_measured():
    num_users, turns = 6, 4
    results, sent = run_users(num_users, turns, staggered=True)
    for u in range(num_users):
        script = user_turns(u, turns, SEED)
        assert [r.text for r in results[u]] == script  # only the measured conversation is returned
        conversations = list(dict.fromkeys(n for n, _ in sent[u]))
        measured = conversations[1] if u % turns else conversations[0]
        lead_in = [c for n, c in sent[u] if n == conversations[0]] if u % turns else []
        assert len(lead_in) == u % turns  # u mod K unmeasured turns of another conversation first
        assert [c for n, c in sent[u] if n == measured] == script
        after = [n for n, _ in sent[u]][len(lead_in) + turns :]
        assert measured not in after and all(len([m for m in after if m == n]) <= turns for n in set(after))
    # the users measured first kept chatting while the others were still being measured
    assert len(sent[0]) > turns
