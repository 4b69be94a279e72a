"""The prefix cache's block-hash chain: the one identity of a block's content, wherever blocks are looked up.

A full block's hash covers the pool's salt, its parent block's hash and its own token ids, so equal hashes mean an
equal prefix up to and including that block. A request's tenant salt becomes the chain's root, so two tenants'
chains never meet. The block manager hashes with it today; a disk tier or a replica router computes the same chain
for the same tokens by importing this module (no torch, no engine state).
"""

from __future__ import annotations

import hashlib
import struct

HASH_BYTES = 16  # a block hash; a salted root is 32 bytes, so a root never equals a block hash


def chain_root(cache_salt: str | None) -> bytes:
    """The parent hash of a chain's first block: empty, or a 32-byte digest of the tenant's salt."""
    if cache_salt is None:
        return b""
    return hashlib.blake2b(
        cache_salt.encode("utf-8", "surrogatepass"), digest_size=32, person=b"cache-salt"
    ).digest()


def num_cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks a prompt of num_tokens may take from the cache: the last token is always left to compute."""
    return max(num_tokens - 1, 0) // block_size


class BlockHasher:
    """Hashes full blocks for one pool: `pool_salt` (from the engine config) is mixed into every hash."""

    def __init__(self, block_size: int, pool_salt: bytes = b"") -> None:
        self.block_size = block_size
        self._salt_digest = hashlib.blake2b(pool_salt, digest_size=HASH_BYTES).digest()

    def hash_block(self, parent_hash: bytes, token_ids: list[int]) -> bytes:
        """Chain hash of one full block: the pool salt, the parent's hash (the root for the first) and the tokens."""
        h = hashlib.blake2b(self._salt_digest, digest_size=HASH_BYTES)
        h.update(parent_hash)
        h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
        return h.digest()

    def extend(
        self, hashes: list[bytes], token_ids: list[int], cache_salt: str | None, num_blocks: int
    ) -> None:
        """Append to `hashes` (a chain over token_ids so far) until it covers num_blocks full blocks."""
        bs = self.block_size
        assert num_blocks * bs <= len(token_ids), (
            f"block {num_blocks - 1} of {len(token_ids)} tokens is not full"
        )
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[i - 1] if i else chain_root(cache_salt)
            hashes.append(self.hash_block(parent, token_ids[i * bs : (i + 1) * bs]))

    def chain(self, token_ids: list[int], cache_salt: str | None = None) -> list[bytes]:
        """The hashes of every full block of token_ids, first block first."""
        hashes: list[bytes] = []
        self.extend(hashes, token_ids, cache_salt, len(token_ids) // self.block_size)
        return hashes
