"""The prefix cache's block-hash chain: the one identity of a block's content, wherever blocks are looked up.

A full block's hash covers the pool's salt, its parent block's hash and its own token ids, so equal hashes mean an
equal prefix up to and including that block. A request's `ChainKey` says where its tenant's own tokens begin: the
blocks wholly inside its public prefix (a published system prompt, the template's own text) hash unsalted, so every
tenant shares them; from the block holding the first non-public token on, the tenant's salt is mixed into the
parent hash, so two tenants' chains part there and never meet again. A disk tier or a replica router computes the
same chain for the same tokens and key by importing this module (no torch, no engine state).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

HASH_BYTES = (
    16  # a block hash; a salted parent is 32 or 48 bytes, so salted and unsalted inputs never coincide
)


# a hash's prefix where compactness matters (replica digests, routes): a false match needs a 64-bit collision
HASH_PREFIX_BYTES = 8

SALT_TAG_BYTES = 8
NO_SALT = bytes(SALT_TAG_BYTES)  # the salt tag of a block every tenant shares


def salt_tag(salt: str | None) -> bytes:
    """8 bytes naming a salt's tenant where blocks are stored (the disk tier's file names), never the salt itself.

    A salt's first line names its tenant (the service writes its caller identity there, and narrows it on further
    lines: a bearer token, a request's own cache_salt), so every salt of one tenant has one tag and purging the tenant
    reaches all its blocks.
    """
    if salt is None:
        return NO_SALT
    tenant = salt.split("\n", 1)[0]
    return hashlib.blake2b(
        tenant.encode("utf-8", "surrogatepass"), digest_size=SALT_TAG_BYTES, person=b"salt-tag"
    ).digest()


def pool_hash_salt(prefix_cache_salt: str) -> bytes:
    """The bytes a pool mixes into every block hash (EngineConfig.prefix_cache_salt): the scheduler's block manager
    and a replica router both build their BlockHasher with it, so their chains agree."""
    return prefix_cache_salt.encode("utf-8")


def chain_root(cache_salt: str | None) -> bytes:
    """What a salt adds to the parent hash where it enters the chain: nothing, or a 32-byte digest of the salt."""
    if cache_salt is None:
        return b""
    return hashlib.blake2b(
        cache_salt.encode("utf-8", "surrogatepass"), digest_size=32, person=b"cache-salt"
    ).digest()


def num_cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks a prompt of num_tokens may take from the cache: the last token is always left to compute."""
    return max(num_tokens - 1, 0) // block_size


@dataclass(frozen=True)
class ChainKey:
    """Whose chain a sequence's blocks belong to: `salt` (None: everyone's) from token `public_prefix_len` on."""

    salt: str | None = None
    public_prefix_len: int = 0  # leading tokens anyone may share: blocks wholly inside them hash unsalted

    def __post_init__(self) -> None:
        if not isinstance(self.public_prefix_len, int) or self.public_prefix_len < 0:
            raise ValueError(
                f"public_prefix_len must be a non-negative integer, got {self.public_prefix_len!r}"
            )

    def salted_from_block(self, block_size: int) -> int:
        """The first block whose hash takes the salt: the one holding token public_prefix_len."""
        return self.public_prefix_len // block_size


class BlockHasher:
    """Hashes full blocks for one pool: `pool_salt` (from the engine config) is mixed into every hash."""

    def __init__(self, block_size: int, pool_salt: bytes = b"") -> None:
        self.block_size = block_size
        self._salt_digest = hashlib.blake2b(pool_salt, digest_size=HASH_BYTES).digest()

    def hash_block(self, parent_hash: bytes, token_ids: list[int]) -> bytes:
        """Chain hash of one full block: the pool salt, the parent's hash (b"" for the first) and the tokens."""
        h = hashlib.blake2b(self._salt_digest, digest_size=HASH_BYTES)
        h.update(parent_hash)
        h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
        return h.digest()

    def extend(self, hashes: list[bytes], token_ids: list[int], key: ChainKey, num_blocks: int) -> None:
        """Append to `hashes` (the chain over token_ids so far, under `key`) until it covers num_blocks full blocks."""
        bs = self.block_size
        assert num_blocks * bs <= len(token_ids), (
            f"block {num_blocks - 1} of {len(token_ids)} tokens is not full"
        )
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(
                self.hash_block(self.parent_input(hashes, key, i), token_ids[i * bs : (i + 1) * bs])
            )

    def parent_input(self, hashes: list[bytes], key: ChainKey, index: int) -> bytes:
        """What block `index` hashes as its parent (`hashes` holds the chain before it): the previous block's hash
        (b"" for the first), with the salt's root where the salt enters the chain. Blocks that share it follow the
        same prefix under the same key: the candidates of a fork inside block `index`."""
        parent = hashes[index - 1] if index else b""
        if index == key.salted_from_block(self.block_size):
            parent += chain_root(key.salt)  # with salted_from == 0 the salt is the chain's root
        return parent

    def chain(self, token_ids: list[int], key: ChainKey | None = None) -> list[bytes]:
        """The hashes of every full block of token_ids under `key` (default: unsalted), first block first."""
        hashes: list[bytes] = []
        self.extend(hashes, token_ids, key or ChainKey(), len(token_ids) // self.block_size)
        return hashes

    def salt_tags(self, key: ChainKey, start: int, end: int) -> list[bytes]:
        """The salt tag of each block in [start, end) of a chain under `key`: NO_SALT inside the public prefix."""
        if start >= end:
            return []
        salted_from = key.salted_from_block(self.block_size)
        tag = salt_tag(key.salt)
        return [NO_SALT if i < salted_from else tag for i in range(start, end)]
