"""The paged KV block pool: ref counts, an LRU free queue, the prefix-cache hash chain and copy-on-write.

A prompt reuses the cached full blocks of its prefix (match_prefix). Where it parts from a cached block inside that
block (a regenerated reply, an edited message, a continued one: the old branch went on past the fork), the tokens
before the fork are not recomputed either: admission copies that block and computes from the fork on
(match_partial). Copying a block costs ~0.06 ms on the CPU these figures come from; recomputing its up to 15
tokens ~2 ms each (docs/users/conversations.md, "Conversation branches").
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from engine.core.hash_chain import HASH_PREFIX_BYTES, BlockHasher, num_cacheable_blocks
from engine.core.sequence import Sequence
from engine.core.utils import cdiv

FREE, CACHED, IN_USE = 0, 1, 2  # block states in snapshots


MAX_PARTIAL_CANDIDATES = 32  # cached blocks compared token by token at one admission (versions of one turn)


@dataclass
class Block:
    """block_size KV slots; `block_hash` is set once the block is full and registered in the prefix cache, and
    with it (where the pool hashed it itself) its parent input and tokens, which a fork inside it compares."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    parent_key: bytes | None = None  # BlockHasher.parent_input of its place in the chain
    token_ids: tuple[int, ...] = ()
    salt_tag: bytes | None = (
        None  # hash_chain.salt_tag of the tenant whose chain it belongs to (NO_SALT: public)
    )


@dataclass(frozen=True)
class BlockPoolStats:
    """Block counts by state, and the prefix cache's query/hit token counters."""

    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    num_shared_blocks: int
    prefix_query_tokens: int
    prefix_hit_tokens: int


class BlockManager:
    """Hands out blocks to sequences; lack of room is a `None` return that leaves everything unchanged."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_salt: bytes = b"",
        copy_partial_blocks: bool = True,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # every ref-0 block, next victim first; cached ones stay findable by hash until popped
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        # several blocks may hold one hash (identical prompts computed at once); the inner dict is an ordered set
        self.hash_to_block_ids: dict[bytes, dict[int, None]] = {}
        # cached blocks by their parent input: where a prompt forks inside a block, its candidates (ordered sets)
        self.copy_partial_blocks = enable_prefix_caching and copy_partial_blocks
        self.parent_to_block_ids: dict[bytes, dict[int, None]] = {}
        self.hasher = BlockHasher(block_size, hash_salt)
        self.num_cached_free = 0  # ref-0 blocks holding a hash
        self.num_shared = 0  # blocks with ref > 1
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        # the first HASH_PREFIX_BYTES of each block's hash, at its block id (zeros: no hash), kept as blocks are
        # stored and evicted, so listing the cache is one copy (cached_hash_prefixes)
        self.hash_prefixes = bytearray(num_blocks * HASH_PREFIX_BYTES)
        self.cache_version = 0  # bumped whenever hash_prefixes changes
        self._prefixes_copy = (0, bytes(self.hash_prefixes))

    def hash_block(self, parent_hash: bytes, token_ids: list[int]) -> bytes:
        """Chain hash of one full block (see engine.core.hash_chain)."""
        return self.hasher.hash_block(parent_hash, token_ids)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks an admission of `seq` would reuse; the last token is always left to compute.

        A sequence's pins (the blocks a disk load filled, after the RAM hits it held meanwhile) come first, as they
        are: the same content may also be cached in other blocks (computed by another sequence during the load),
        and an admission that took those would leave its own pins idle, holding the very room it lacks.
        """
        if seq.block_table or seq.num_computed_tokens:
            raise RuntimeError(f"seq {seq.seq_id} already holds blocks; prefix matching is for admission")
        if not self.enable_prefix_caching:
            return []
        num_cacheable = num_cacheable_blocks(len(seq), self.block_size)
        block_ids: list[int] = []
        for i, block_id in enumerate(seq.pinned_block_ids[:num_cacheable]):
            if self.blocks[block_id].block_hash != self._block_hash(seq, i):
                break
            block_ids.append(block_id)
        for i in range(len(block_ids), num_cacheable):
            candidates = self.hash_to_block_ids.get(self._block_hash(seq, i))
            if not candidates:
                break
            block_ids.append(next(iter(candidates)))
        return block_ids

    def match_partial(self, seq: Sequence, num_cached_blocks: int) -> tuple[int, int] | None:
        """A cached block whose first tokens the sequence shares right after its `num_cached_blocks` cached blocks
        (it forks inside that block), and how many: (block_id, num_tokens), or None. Admission copies that block
        instead of recomputing those tokens; the last token is always left to compute."""
        if not self.copy_partial_blocks:
            return None
        bs = self.block_size
        start = num_cached_blocks * bs
        limit = min(bs - 1, len(seq) - 1 - start)
        if limit < 1:
            return None
        if num_cached_blocks:
            self._block_hash(seq, num_cached_blocks - 1)
        parent = self.hasher.parent_input(seq.block_hashes, seq.chain_key, num_cached_blocks)
        wanted = seq.token_ids[start : start + limit]
        best: tuple[int, int] | None = None
        candidates = reversed(self.parent_to_block_ids.get(parent, {}))  # newest first
        for block_id in itertools.islice(candidates, MAX_PARTIAL_CANDIDATES):
            shared = _common_prefix_len(self.blocks[block_id].token_ids, wanted)
            if shared and (best is None or shared > best[1]):
                best = (block_id, shared)
                if shared == limit:
                    break
        return best

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        cached_block_ids: list[int] | None = None,
        partial: tuple[int, int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[tuple[int, int]] | None:
        """Cover num_computed_tokens + num_new_tokens slots; returns the CoW copies (src, dst) made, or None.

        `num_lookahead_tokens`: how many of those slots lie past the sequence's tokens (proposed tokens that the step
        verifies; `trim` gives back the blocks of those it rejects).

        Passing `cached_block_ids` (from match_prefix, possibly empty) admits the sequence: it takes those blocks
        and starts computing after them; with `partial` (from match_partial) its next block is a copy of that one
        and computing starts at the fork inside it.
        """
        bs = self.block_size
        admitting = cached_block_ids is not None
        if admitting and (seq.block_table or seq.num_computed_tokens):
            raise RuntimeError(f"seq {seq.seq_id} already holds blocks; it cannot be admitted again")
        if partial is not None and not admitting:
            raise RuntimeError(f"seq {seq.seq_id}: a partial block is copied only at admission")
        table = list(cached_block_ids) if admitting else seq.block_table
        num_partial = partial[1] if partial is not None else 0
        num_computed = len(table) * bs + num_partial if admitting else seq.num_computed_tokens
        end = num_computed + num_new_tokens
        if end > len(seq) + num_lookahead_tokens:
            raise RuntimeError(f"seq {seq.seq_id}: slots up to {end} requested for {len(seq)} tokens")
        num_table_blocks = cdiv(end, bs)
        num_new_blocks = max(0, num_table_blocks - len(table))
        written = range(num_computed // bs, min(len(table), num_table_blocks)) if num_new_tokens else range(0)
        cow_indices = [i for i in written if self.blocks[table[i]].ref_count > 1]
        for i in written:
            assert self.blocks[table[i]].block_hash is None, f"write into cached full block {table[i]}"
        num_reused_free = sum(1 for b in table if self.blocks[b].ref_count == 0) if admitting else 0
        if num_new_blocks + len(cow_indices) > len(self.free_queue) - num_reused_free:
            return None

        if admitting:
            for block_id in table:
                self._incref(block_id)
            seq.block_table = table
            seq.num_computed_tokens = seq.num_cached_tokens = num_computed
            seq.num_hashed_blocks = len(table)
            if self.enable_prefix_caching:
                self.prefix_query_tokens += len(seq)
                self.prefix_hit_tokens += num_computed
        copies = []
        for i in cow_indices:
            src, dst = table[i], self._pop_free()
            self._decref(src)
            table[i] = dst
            copies.append((src, dst))
        num_held = len(table)
        table.extend(self._pop_free() for _ in range(num_new_blocks))
        # The source may have been handed out just now (it was free, only cached): the step's copies run before it
        # stores any K/V, so what is copied is still the cached content.
        if partial is not None and partial[0] != table[num_held]:
            copies.append((partial[0], table[num_held]))
        return copies

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; its tail is evicted before its prefix, unhashed blocks first of all."""
        for block_id in reversed(seq.block_table):
            self._decref(block_id)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past the sequence's computed tokens (those held only rejected proposals): each was
        allocated for this step, unshared and unhashed, and goes back to the free queue."""
        keep = cdiv(seq.num_computed_tokens, self.block_size)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            block = self.blocks[block_id]
            assert block.ref_count == 1 and block.block_hash is None, (
                f"trimmed block {block_id} is shared or cached"
            )
            self._decref(block_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let `child` share every block of `parent`, the partial tail included (written later through CoW)."""
        if child.block_table:
            raise RuntimeError(f"fork target seq {child.seq_id} already holds blocks")
        for block_id in parent.block_table:
            self._incref(block_id)
        child.block_table = list(parent.block_table)
        child.num_hashed_blocks = parent.num_hashed_blocks
        child.block_hashes = parent.block_hashes[: parent.num_hashed_blocks]

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Hash and register the blocks that num_computed_tokens now covers completely."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        assert num_full <= len(seq.block_table), f"seq {seq.seq_id}: computed tokens beyond its block table"
        start = seq.num_hashed_blocks
        tags = self.hasher.salt_tags(seq.chain_key, start, num_full)  # [] on most steps: no block filled
        for i in range(start, num_full):
            block, block_hash = self.blocks[seq.block_table[i]], self._block_hash(seq, i)
            if block.block_hash is not None:  # shared with a sibling forked this step, which hashed it first
                assert block.block_hash == block_hash, f"block {block.block_id} holds two different contents"
                continue
            block.block_hash, block.salt_tag = block_hash, tags[i - start]
            self._index_hash(block)
            if self.copy_partial_blocks:
                block.parent_key = self.hasher.parent_input(seq.block_hashes, seq.chain_key, i)
                block.token_ids = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
                self.parent_to_block_ids.setdefault(block.parent_key, {})[block.block_id] = None
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)

    # ---- loading from a lower tier: blocks held outside any block table until their sequence is admitted -------
    def chain_hashes(self, seq: Sequence, start: int, end: int) -> list[bytes]:
        """The hashes of the sequence's full blocks [start, end) (the chain is extended as needed)."""
        if end > start:
            self._block_hash(seq, end - 1)
        return seq.block_hashes[start:end]

    def reserve(self, num_blocks: int, pin: list[int]) -> list[int] | None:
        """Pin the blocks `pin` (cached prefix hits) and take num_blocks empty blocks (ref 1) to load into, or
        None, changing nothing, when the pool lacks the room."""
        num_pinned_free = sum(1 for b in pin if self.blocks[b].ref_count == 0)
        if num_blocks > len(self.free_queue) - num_pinned_free:
            return None
        for block_id in pin:
            self._incref(block_id)
        return [self._pop_free() for _ in range(num_blocks)]

    def register(self, block_id: int, block_hash: bytes, salt_tag: bytes) -> None:
        """A held block now holds the content `block_hash` names (it was loaded): it joins the prefix cache."""
        block = self.blocks[block_id]
        assert block.ref_count > 0 and block.block_hash is None, (
            f"block {block_id} is not an empty held block"
        )
        block.block_hash, block.salt_tag = block_hash, salt_tag
        self._index_hash(block)

    def purge_salt(self, salt_tag: bytes) -> int:
        """Forget the cached content of every free block of the tenant `salt_tag` names (the tenant is gone): they
        become empty blocks, handed out first, and no lookup finds them again. Blocks still in use are their
        sequences' (abort those first). Returns how many blocks were forgotten."""
        purged = [b for b in self.free_queue.values() if b.block_hash is not None and b.salt_tag == salt_tag]
        for block in purged:
            self.num_cached_free -= 1
            self._forget(block)
            self.free_queue.move_to_end(block.block_id, last=False)
        return len(purged)

    def release(self, block_ids: list[int]) -> None:
        """Drop the references `reserve` took (or pins): cached blocks stay cached, empty ones go first."""
        for block_id in reversed(block_ids):
            self._decref(block_id)

    def num_slots_allocated(self, seq: Sequence) -> int:
        """KV slots reserved for the sequence (its table length times block_size)."""
        return len(seq.block_table) * self.block_size

    def stats(self) -> BlockPoolStats:
        """Block counts by state (O(1)) and the prefix cache counters."""
        num_ref0 = len(self.free_queue)
        return BlockPoolStats(
            num_blocks=self.num_blocks,
            num_free_blocks=num_ref0 - self.num_cached_free,
            num_cached_blocks=self.num_cached_free,
            num_used_blocks=self.num_blocks - num_ref0,
            num_shared_blocks=self.num_shared,
            prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
        )

    def cached_hash_prefixes(self) -> bytes:
        """The first HASH_PREFIX_BYTES of the hash of every block in the prefix cache, in use or evictable, at its
        block id (zeros where a block holds none; a hash several blocks hold appears as often): what a replica
        router matches chains against. One copy of num_blocks * 8 bytes (~0.1 ms for 250,000 blocks), and none
        while nothing changed."""
        version, prefixes = self._prefixes_copy
        if version != self.cache_version:
            prefixes = bytes(self.hash_prefixes)
            self._prefixes_copy = (self.cache_version, prefixes)
        return prefixes

    def snapshot(self, hash_block_ids: range | None = None) -> tuple[list[int], list[int], dict[int, str]]:
        """Per-block state codes, ref counts, and the first 8 hex chars of every held hash (only of the blocks in
        `hash_block_ids` when given: in a pool of 250,000 blocks all of them cost ~20 ms a snapshot)."""
        blocks = self.blocks
        states = [IN_USE if b.ref_count else FREE if b.block_hash is None else CACHED for b in blocks]
        picked = (
            blocks if hash_block_ids is None else (blocks[i] for i in hash_block_ids if 0 <= i < len(blocks))
        )
        hashes = {b.block_id: b.block_hash.hex()[:8] for b in picked if b.block_hash is not None}
        return states, [b.ref_count for b in blocks], hashes

    def check_invariants(self, live_seqs: Iterable[Sequence], held: Iterable[int] = ()) -> None:
        """Assert the pool's bookkeeping against the live sequences and the blocks `held` outside their tables
        (pins and loads in flight; call between steps)."""
        live_seqs = list(live_seqs)
        refs = Counter(b for seq in live_seqs for b in seq.block_table)
        refs.update(held)
        assert sum(b.ref_count for b in self.blocks) == refs.total(), "ref sum"
        for b in self.blocks:
            assert b.ref_count == refs[b.block_id], (
                f"block {b.block_id}: ref {b.ref_count}, {refs[b.block_id]} users"
            )
            assert (b.ref_count == 0) == (b.block_id in self.free_queue), f"block {b.block_id}: free queue"
            if b.block_hash is not None:
                assert b.block_id in self.hash_to_block_ids.get(b.block_hash, {}), (
                    f"block {b.block_id}: no map"
                )
        for block_hash, block_ids in self.hash_to_block_ids.items():
            assert block_ids, "empty hash entry"
            assert all(self.blocks[i].block_hash == block_hash for i in block_ids), "stale hash entry"
        n = HASH_PREFIX_BYTES
        for b in self.blocks:
            prefix = b.block_hash[:n] if b.block_hash is not None else bytes(n)
            assert self.hash_prefixes[b.block_id * n : (b.block_id + 1) * n] == prefix, (
                f"block {b.block_id} prefix"
            )
        assert self.cached_hash_prefixes() == self.hash_prefixes, "stale copy of the hash prefixes"
        for parent_key, block_ids in self.parent_to_block_ids.items():
            assert block_ids, "empty parent entry"
            for i in block_ids:
                block = self.blocks[i]
                assert block.parent_key == parent_key and block.block_hash is not None, (
                    f"block {i}: stale parent"
                )
                assert len(block.token_ids) == self.block_size, (
                    f"block {i}: {len(block.token_ids)} tokens kept"
                )
        for b in self.blocks:
            if b.parent_key is not None:
                assert b.block_id in self.parent_to_block_ids.get(b.parent_key, {}), (
                    f"block {b.block_id}: no parent"
                )
        num_cached = sum(b.block_hash is not None for b in self.free_queue.values())
        assert self.num_cached_free == num_cached, f"cached count {self.num_cached_free} != {num_cached}"
        assert self.num_shared == sum(b.ref_count > 1 for b in self.blocks), "shared count"
        for seq in live_seqs:
            waste = self.num_slots_allocated(seq) - seq.num_computed_tokens
            assert 0 <= waste < self.block_size, f"seq {seq.seq_id}: {waste} allocated slots hold no KV"
            k = seq.num_hashed_blocks
            assert k <= min(len(seq.block_table), len(seq.block_hashes)), (
                f"seq {seq.seq_id}: {k} hashed blocks"
            )
            for block_id, block_hash in zip(seq.block_table[:k], seq.block_hashes[:k], strict=True):
                assert self.blocks[block_id].block_hash == block_hash, (
                    f"seq {seq.seq_id}: chain at {block_id}"
                )

    def _block_hash(self, seq: Sequence, index: int) -> bytes:
        # seq.block_hashes caches the chain over its token ids, which only ever grow, so it survives preemption
        self.hasher.extend(seq.block_hashes, seq.token_ids, seq.chain_key, index + 1)
        return seq.block_hashes[index]

    def _pop_free(self) -> int:
        block_id, block = self.free_queue.popitem(last=False)
        if block.block_hash is not None:  # evict: the hash no longer describes what the block will hold
            self.num_cached_free -= 1
            self._forget(block)
        block.ref_count = 1
        return block_id

    def _index_hash(self, block: Block) -> None:
        """Make a block findable by its (just set) hash."""
        assert block.block_hash is not None
        self.hash_to_block_ids.setdefault(block.block_hash, {})[block.block_id] = None
        self._set_prefix(block.block_id, block.block_hash[:HASH_PREFIX_BYTES])

    def _set_prefix(self, block_id: int, prefix: bytes) -> None:
        start = block_id * HASH_PREFIX_BYTES
        self.hash_prefixes[start : start + HASH_PREFIX_BYTES] = prefix
        self.cache_version += 1

    def _forget(self, block: Block) -> None:
        """Take a block's content out of the prefix cache's indexes (eviction, a purge)."""
        assert block.block_hash is not None
        ids = self.hash_to_block_ids[block.block_hash]
        del ids[block.block_id]
        if not ids:
            del self.hash_to_block_ids[block.block_hash]
        self._set_prefix(block.block_id, bytes(HASH_PREFIX_BYTES))
        block.block_hash, block.salt_tag = None, None
        if block.parent_key is not None:
            siblings = self.parent_to_block_ids[block.parent_key]
            del siblings[block.block_id]
            if not siblings:
                del self.parent_to_block_ids[block.parent_key]
            block.parent_key, block.token_ids = None, ()

    def _incref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_queue[block_id]
            self.num_cached_free -= block.block_hash is not None
        block.ref_count += 1
        self.num_shared += block.ref_count == 2

    def _decref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed more often than taken"
        self.num_shared -= block.ref_count == 2
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = block
            if block.block_hash is None:
                # holds nothing reusable: hand it out before any cached block (a deviation from plain LRU)
                self.free_queue.move_to_end(block_id, last=False)
            else:
                self.num_cached_free += 1


# The twin of app/http/public_prefix.py's common_prefix_len: the engine may not import the app, and the app's
# history builder imports no engine module (tests/app/chat/test_conversation.py), so each layer keeps its own six lines.
def _common_prefix_len(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
