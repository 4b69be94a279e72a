"""The time a request's grammar masks may cost: a ceiling on any one mask and a budget for all of them.

Masks are computed during the step (engine/worker/guided.py) and the step waits for the slowest, so a grammar whose
masks are costly slows every other request in the batch. The first mask of a grammar is limited when it compiles
(grammar.MAX_FIRST_MASK_S); the later ones are limited here, per request: every mask a request's samples need,
however many a step takes (one per sampling row; k + 1 per row once speculative decoding verifies k drafts), is
charged to the request's one MaskAccount. A mask over the ceiling, or masks over the budget in all, end the request
with an error naming the limit and its setting.

Time is the CPU time of the thread computing the mask (time.thread_time): what the mask itself costs, not the time
it waited for a core that the model's forward pass or another process was using.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class MaskAccount:
    """One request's mask time so far; `error` says which limit stopped it (None: within both)."""

    spent_s: float = 0.0
    num_masks: int = 0
    error: str | None = None
    over_ceiling: bool = False  # one mask alone was over the ceiling: the grammar itself is too costly


class MaskBudget:
    """Times masks and charges them to their request's account against `max_mask_s` and `budget_s`."""

    def __init__(
        self, max_mask_s: float, budget_s: float, clock: Callable[[], float] = time.thread_time
    ) -> None:
        self.max_mask_s = max_mask_s
        self.budget_s = budget_s
        self._clock = clock

    def timed(self, account: MaskAccount, compute: Callable[[], None]) -> bool:
        """Run one mask's `compute` and charge its time to `account`. False when the account is over a limit, now
        or already (then `compute` is not run): the request must end with `account.error`."""
        if account.error is not None:
            return False
        start = self._clock()
        compute()
        self.charge(account, self._clock() - start)
        return account.error is None

    def charge(self, account: MaskAccount, seconds: float) -> None:
        """Add one mask's `seconds` to the account; sets its error when that mask or the total is over a limit."""
        account.spent_s += seconds
        account.num_masks += 1
        if account.error is not None:
            return
        if seconds > self.max_mask_s:
            account.over_ceiling = True
            account.error = (
                f"structured output stopped: a token mask took {seconds * 1000:.1f} ms, over the limit of "
                f"{self.max_mask_s * 1000:g} ms a mask (setting guided_mask_max_s)"
            )
        elif account.spent_s > self.budget_s:
            account.error = (
                f"structured output stopped: the request's {account.num_masks} token masks took "
                f"{account.spent_s:.3f} s in all, over the budget of {self.budget_s:g} s a request "
                "(setting guided_mask_budget_s)"
            )
