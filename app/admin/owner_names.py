"""The admin page names the accounts behind live requests: a request's label carries its account's id (and its
per-account API key's id), and this looks their names up in the database (app/db), once per account or key:
usernames and key names never change, so a name once found is kept."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from app.db import Store
from app.engine_client.request_label import RequestLabel

logger = logging.getLogger(__name__)
MAX_NAMES = 4096  # names kept before the cache starts again (a page shows a few hundred requests at most)


class OwnerNames:
    """Usernames and key names by id, looked up in batches as new ones appear."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.usernames: dict[str, str] = {}
        self.key_names: dict[str, str] = {}

    async def learn(self, labels: Iterable[RequestLabel | None]) -> None:
        """Look up the names of these labels' accounts and keys not known yet (a database that cannot answer
        leaves them unnamed until the next sample)."""
        live = [label for label in labels if label is not None]
        user_ids = sorted({x.account_id for x in live if x.account_id and x.account_id not in self.usernames})
        key_ids = sorted({x.key_id for x in live if x.key_id and x.key_id not in self.key_names})
        if not user_ids and not key_ids:
            return
        if len(self.usernames) + len(self.key_names) > MAX_NAMES:
            self.usernames.clear()
            self.key_names.clear()
        try:
            self.usernames.update(await self.store.accounts.usernames(user_ids))
            self.key_names.update(await self.store.accounts.api_key_names(key_ids))
        except Exception:  # noqa: BLE001 - the page then shows ids, as before; an outage shows elsewhere
            logger.debug("owner names not looked up", exc_info=True)

    def name(self, label: RequestLabel) -> RequestLabel:
        """The label with its account's username (and key's name) where known."""
        if label.account_id is None:
            return label
        key_name = self.key_names.get(label.key_id) if label.key_id else None
        return label.named(self.usernames.get(label.account_id), key_name)
