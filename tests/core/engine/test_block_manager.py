"""Block allocation, reference counts and the prefix cache."""

from omni_core.scheduler.block_manager import BlockManager
from omni_core.scheduler.sampling_params import SamplingParams
from omni_core.scheduler.sequence import Sequence


def seq(tokens, embeds=None):
    return Sequence("r", tokens, SamplingParams(), prompt_embeds=embeds)


def computed(bm, s):
    s.num_computed_tokens = len(s)
    bm.register_computed(s)


def test_full_blocks_are_shared_after_they_are_computed():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(list(range(10)))  # blocks [0-3], [4-7], [8-9]
    assert bm.allocate(a) and a.num_computed_tokens == 0 and bm.num_free_blocks == 7
    b = seq(list(range(10)))
    assert bm.allocate(b) and b.num_computed_tokens == 0  # a's blocks are not computed yet
    bm.free(b)
    computed(bm, a)
    c = seq(list(range(9)) + [99, 98])
    assert bm.allocate(c)
    assert c.block_table[:2] == a.block_table[:2] and c.num_computed_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free(a)
    bm.free(c)
    assert bm.num_free_blocks == 10


def test_block_with_the_last_token_is_never_reused():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(list(range(8)))
    bm.allocate(a)
    computed(bm, a)
    b = seq(list(range(8)))  # same 8 tokens: the second block holds b's last token
    bm.allocate(b)
    assert b.num_computed_tokens == 4 and b.block_table[1] != a.block_table[1]


def test_freed_blocks_keep_their_hash_until_reused():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = seq(list(range(9)))
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    again = seq(list(range(9)))
    assert bm.allocate(again) and again.num_computed_tokens == 8 and bm.num_free_blocks == 0
    bm.free(again)
    other = seq([50] * 12)  # needs all three blocks: the cached hashes are overwritten
    assert bm.allocate(other)
    bm.free(other)
    third = seq(list(range(9)))
    assert bm.allocate(third) and third.num_computed_tokens == 0


def test_allocation_fails_cleanly_when_full_and_embedding_prompts_skip_the_cache():
    import torch

    bm = BlockManager(num_blocks=2, block_size=4)
    big = seq(list(range(12)))
    assert not bm.allocate(big) and big.block_table == [] and bm.num_free_blocks == 2
    e = seq(None, embeds=torch.zeros(6, 8))
    assert bm.allocate(e)
    computed(bm, e)
    assert bm.hash_to_block == {}


def test_decode_appends_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=3, block_size=4)
    s = seq([1, 2, 3, 4])
    bm.allocate(s)
    s.append_token(5)  # the next step writes position 4: a new block
    assert bm.can_append(s)
    bm.append_slot(s)
    assert len(s.block_table) == 2
    s.append_token(6)
    bm.append_slot(s)
    assert len(s.block_table) == 2
