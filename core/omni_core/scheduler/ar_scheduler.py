"""Which sequences run in the next engine step: continuous batching with chunked prefill.

A step is either a prefill step (prompts, possibly a chunk of one, under a token budget) or a
decode step (one token for every running sequence); prefill goes first so new requests join the
running batch as soon as possible. When a decode step lacks a KV block, a paused sequence
(waiting for input), else the most recently admitted one, is preempted: its blocks are freed and
it re-enters the waiting queue to be recomputed (its prompt is then prompt + tokens generated so
far; a paused one once it is resumed).
"""

from __future__ import annotations

from collections import deque

from omni_core.scheduler.block_manager import BlockManager
from omni_core.scheduler.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()  # have blocks, prompt only partly computed
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def has_runnable(self) -> bool:
        """Work a step can do now: paused sequences wait for their input."""
        return bool(self.prefilling or any(not s.paused for s in (*self.waiting, *self.running)))

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Returns the sequences of the next step and whether it is a prefill step.

        Each scheduled sequence's ``num_scheduled_tokens`` says how many tokens it computes.
        """
        batch = self._schedule_prefill()
        if batch:
            return batch, True
        return self._schedule_decode(), False

    def _schedule_prefill(self) -> list[Sequence]:
        batch: list[Sequence] = []
        budget = self.max_num_batched_tokens
        active = len(self.running) + len(self.prefilling)
        # partly prefilled sequences first: they already hold blocks
        for seq in list(self.prefilling):
            if budget == 0:
                break
            seq.num_scheduled_tokens = min(len(seq) - seq.num_computed_tokens, budget)
            budget -= seq.num_scheduled_tokens
            batch.append(seq)
        while budget > 0 and active < self.max_num_seqs:
            seq = next((s for s in self.waiting if not s.paused), None)
            if seq is None or not self.block_manager.allocate(seq):
                break
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.prefilling.append(seq)
            active += 1
            seq.num_scheduled_tokens = min(len(seq) - seq.num_computed_tokens, budget)
            budget -= seq.num_scheduled_tokens
            batch.append(seq)
        return batch

    def _schedule_decode(self) -> list[Sequence]:
        batch: list[Sequence] = []
        candidates = deque(s for s in self.running if not s.paused)
        # paused sequences (waiting for input) give their blocks up first, newest first; they
        # are recomputed once resumed
        paused = [s for s in self.running if s.paused]
        while candidates:
            seq = candidates.popleft()
            while not self.block_manager.can_append(seq):
                victim = paused.pop() if paused else candidates.pop() if candidates else seq
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slot(seq)
                seq.num_scheduled_tokens = 1
                batch.append(seq)
        return batch

    def schedule_ahead(self, seqs: list[Sequence]) -> list[Sequence] | None:
        """The decode step after the one ``seqs`` run (in flight, its tokens not applied yet):
        those of ``seqs`` that do not reach ``max_tokens`` with the token in flight, each given
        the KV slot one token on. None when that step must wait for the tokens: a request is
        waiting or prefilling, the running set is no longer ``seqs`` (an abort, a finish), or a
        block is missing (only a scheduled step may preempt)."""
        if self.waiting or self.prefilling or list(self.running) != seqs or any(s.paused for s in seqs):
            return None
        batch = [s for s in seqs if s.num_output_tokens + 1 < s.params.max_tokens]
        bm = self.block_manager
        if not batch or sum(bm.needs_block(s, ahead=1) for s in batch) > bm.num_free_blocks:
            return None
        for seq in batch:
            bm.append_slot(seq, ahead=1)
            seq.num_scheduled_tokens = 1
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], is_prefill: bool, sampled: dict[int, int]) -> list[Sequence]:
        """Advance ``seqs`` after a step; ``sampled`` maps seq_id to its new token (sequences
        whose prefill is still partial have none). Returns the sequences that finished."""
        finished = []
        for seq in seqs:
            # a decode step computes one token; its sequences may already be scheduled ahead
            seq.num_computed_tokens += seq.num_scheduled_tokens if is_prefill else 1
            seq.num_scheduled_tokens = 0
            self.block_manager.register_computed(seq)
            token = sampled.get(seq.seq_id)
            if token is None:
                continue
            if is_prefill:
                self.prefilling.remove(seq)
                self.running.append(seq)
            seq.append_token(token)
            reason = seq.check_stop(token)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove ``seq`` wherever it is and free its blocks (finish or abort)."""
        for queue in (self.running, self.prefilling, self.waiting):
            if seq in queue:
                queue.remove(seq)
                break
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
