"""Paged KV-cache blocks: allocation, reference counts and the prefix cache.

A block holds ``block_size`` consecutive tokens of one or more sequences' KV. Once a full block's
KV is computed, its content hash (chained over all previous blocks, so equal hashes mean equal
prefixes) is registered; a later sequence with the same prefix reuses the block instead of
recomputing it. Freed blocks keep their hash until they are handed out again, so a preempted or
repeated prompt often finds its blocks still there.
"""

from __future__ import annotations

from omni_core.scheduler.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(prev_hash: int, token_ids: list[int] | tuple[int, ...]) -> int:
    return hash((prev_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # insertion-ordered set: least recently freed first, so cached blocks live longest
        self.free_ids: dict[int, None] = dict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_hits = 0  # tokens served from the cache, for stats

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _take_free(self, block_id: int | None = None) -> Block:
        if block_id is None:
            block_id = next(iter(self.free_ids))
        del self.free_ids[block_id]
        block = self.blocks[block_id]
        block.ref_count = 1
        return block

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of ``seq``.

        The block holding the last token is never reused: its token must be computed to get the
        logits, and writing it into a shared block would touch another sequence's cache.
        """
        if not self.enable_prefix_caching or seq.prefix_root is None:
            return []
        hits: list[int] = []
        prev = seq.prefix_root
        for i in range((len(seq) - 1) // self.block_size):
            tokens = seq.block_tokens(i, self.block_size)
            h = chain_hash(prev, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
                break
            hits.append(block_id)
            prev = h
        return hits

    def allocate(self, seq: Sequence) -> bool:
        """Give ``seq`` blocks for all its tokens, reusing cached ones; False if too few are free."""
        assert not seq.block_table
        hits = self._cached_prefix(seq)
        needed = seq.num_blocks_for(len(seq), self.block_size)
        hits_in_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if needed - len(hits) + hits_in_free > self.num_free_blocks:
            return False
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self._take_free(block_id)
            else:
                block.ref_count += 1
            seq.block_table.append(block_id)
        for _ in range(needed - len(hits)):
            seq.block_table.append(self._fresh().block_id)
        seq.num_hashed_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        self.prefix_hits += seq.num_computed_tokens
        return True

    def _fresh(self) -> Block:
        block = self._take_free()
        if block.hash is not None:
            if self.hash_to_block.get(block.hash) == block.block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, ()
        return block

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_ids[block_id] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0

    def needs_block(self, seq: Sequence, ahead: int = 0) -> bool:
        """Whether the next decode step (which writes KV at position ``len(seq) - 1 + ahead``;
        ``ahead``: tokens sampled but not appended yet) needs a new block."""
        return len(seq.block_table) < seq.num_blocks_for(len(seq) + ahead, self.block_size)

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next decode step (which writes KV at position ``len(seq) - 1``) fits."""
        return not self.needs_block(seq) or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence, ahead: int = 0) -> None:
        if self.needs_block(seq, ahead):
            seq.block_table.append(self._fresh().block_id)

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of every free block (blocks in use keep theirs); returns how many
        were forgotten. For benchmarks and weight reloads: later prompts are computed anew."""
        dropped = 0
        for block_id in self.free_ids:
            block = self.blocks[block_id]
            if block.hash is not None:
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash, block.token_ids = None, ()
                dropped += 1
        return dropped

    def register_computed(self, seq: Sequence) -> None:
        """Publish the hashes of ``seq``'s newly completed full blocks to the prefix cache."""
        if not self.enable_prefix_caching or seq.prefix_root is None:
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_hashed_blocks:
            return
        prev = self.blocks[seq.block_table[seq.num_hashed_blocks - 1]].hash if seq.num_hashed_blocks else seq.prefix_root
        for i in range(seq.num_hashed_blocks, full):
            tokens = tuple(seq.block_tokens(i, self.block_size))
            h = chain_hash(prev, tokens)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block.setdefault(h, block.block_id)
            prev = h
        seq.num_hashed_blocks = full
