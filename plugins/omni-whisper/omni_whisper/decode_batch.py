"""The running batch of the decoder: one row per window being decoded, stepped together.

Rows live in preallocated tensors (self-attention cache up to the decoder's 448 positions, and
cross-attention keys/values of the row's window) and stay packed in rows ``0..n-1``: a finished
row is replaced by the last one, so every step works on views, never on gathered copies.
Where the platform captures graphs (CUDA) a step replays a captured graph of the decoder
(``decode_graphs``) unless told not to.
"""

from __future__ import annotations

import torch
from omni_core.platforms import platform_for

from omni_whisper.decode_graphs import DecodeGraphs
from omni_whisper.decoding import LogitRules, Window
from omni_whisper.model import WhisperModel


class DecodeBatch:
    def __init__(self, model: WhisperModel, rules: LogitRules, capacity: int, source_positions: int,
                 cuda_graphs: bool = True):
        self.model, self.rules, self.capacity = model, rules, capacity
        self.device = model.decoder.embed_tokens.weight.device
        self.graphs = DecodeGraphs(model, capacity) if cuda_graphs and platform_for(self.device).supports_graphs else None
        self.max_positions = model.config.max_target_positions
        self.source_positions = source_positions
        self.allocated = 0
        self.self_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grow(min(capacity, 4))
        self.windows: list[Window] = []
        self.lengths: list[int] = []  # positions filled in each row's self-attention cache
        self.feed: list[int] = []  # the token each row feeds at the next step
        self.generator = torch.Generator(self.device).manual_seed(0)

    def _grow(self, rows: int) -> None:
        """Reallocate for ``rows`` rows, keeping the running ones: memory follows the load, up to
        ``capacity`` (a large checkpoint's cross-attention K/V is big: layers x 2 x 1500 x d)."""
        config, weight = self.model.config, self.model.decoder.embed_tokens.weight
        heads = config.decoder_attention_heads
        cross_shape = (rows, heads, self.source_positions, config.d_model // heads)
        self_kv = self.model.new_self_cache(rows)
        cross_kv = [(weight.new_zeros(cross_shape), weight.new_zeros(cross_shape)) for _ in self.model.decoder.layers]
        used = len(getattr(self, "windows", []))
        for old, new in ((self.self_kv, self_kv), (self.cross_kv, cross_kv)):
            for (old_k, old_v), (new_k, new_v) in zip(old, new, strict=False):
                new_k[:used] = old_k[:used]
                new_v[:used] = old_v[:used]
        self.self_kv, self.cross_kv, self.allocated = self_kv, cross_kv, rows

    def __len__(self) -> int:
        return len(self.windows)

    def free_rows(self) -> int:
        return self.capacity - len(self.windows)

    def admit(self, window: Window, encoded: torch.Tensor) -> None:
        """Add a window: its cross-attention K/V from ``encoded`` [S, D], once; its prompt prefilled."""
        row = len(self.windows)
        if row == self.allocated:
            self._grow(min(self.capacity, 2 * self.allocated))
        with torch.inference_mode():
            for (k, v), (ck, cv) in zip(self.model.decoder.cross_kv(encoded[None]), self.cross_kv, strict=True):
                ck[row] = k[0]
                cv[row] = v[0]
            prefix = window.prompt[:-1]
            # prefilled in two runs when <|startoftranscript|> is in it: the first ends there, for
            # the no-speech probability (a forward gives its last token's logits)
            sot = prefix.index(self.rules.tok.sot) + 1 if self.rules.tok.sot in prefix else 0
            window.no_speech_at_admission = None
            for start, end in ((0, sot), (sot, len(prefix))):
                if end > start:
                    logits = self.model.decoder(
                        torch.tensor([prefix[start:end]], device=self.device),
                        torch.full((1,), start, dtype=torch.long, device=self.device),
                        [(k[row : row + 1], v[row : row + 1]) for k, v in self.self_kv],
                        [(k[row : row + 1], v[row : row + 1]) for k, v in self.cross_kv],
                    )
                    if end == sot:
                        window.no_speech_at_admission = self._no_speech(logits)[0]
        self.windows.append(window)
        self.lengths.append(len(prefix))
        self.feed.append(window.prompt[-1])

    def step(self) -> list[int]:
        """One decoder step for every row; returns the rows whose window finished."""
        count = len(self.windows)
        with torch.inference_mode():
            if self.graphs is not None:
                logits = self.graphs.logits(self.feed, self.lengths, self.self_kv, self.cross_kv).float()
            else:
                logits = self.model.decoder(
                    torch.tensor(self.feed, device=self.device)[:, None],
                    torch.tensor(self.lengths, device=self.device),
                    [(k[:count], v[:count]) for k, v in self.self_kv],
                    [(k[:count], v[:count]) for k, v in self.cross_kv],
                ).float()
            # each window's no-speech probability at its first step (before the rules edit the
            # logits: Whisper reads it from the raw ones), to the host with the tokens
            first = [row for row, window in enumerate(self.windows) if not window.tokens]
            no_speech = self._first_step_no_speech(logits, first)
            self.rules.apply(logits, self.windows)
            chosen = logits.argmax(dim=-1)
            temperatures = [w.temperature for w in self.windows]
            if any(t > 0 for t in temperatures):  # decided on the host: no wait on the device
                temperatures = torch.tensor(temperatures, device=self.device)
                sampled = temperatures > 0
                probs = torch.softmax(logits[sampled] / temperatures[sampled, None], dim=-1)
                chosen[sampled] = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
            # log-probability (log_softmax + gather: on the CPU twice as fast as logsumexp at 16 x 51864)
            picked = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
            # tokens and log-probabilities in one copy to the host (token ids < 2^24: exact as float32)
            host = torch.stack([chosen.float(), picked, *([no_speech] if no_speech is not None else [])]).tolist()
            chosen, picked = host[0], host[1]
            for row in first:  # (no_speech is not None when a row is at its first step)
                self.windows[row].no_speech_prob = host[2][row]
                self.windows[row].no_speech_at_admission = None  # read: the device value is not kept
        finished = []
        eot = self.rules.tok.eot
        for row, (window, token, logprob) in enumerate(zip(self.windows, map(int, chosen), picked, strict=True)):
            window.tokens.append(token)
            window.logprob_sum += logprob
            self.lengths[row] += 1
            self.feed[row] = token
            full = self.lengths[row] + 1 >= self.max_positions
            if token == eot or len(window.tokens) >= window.max_new_tokens or full:
                finished.append(row)
        return finished

    def _no_speech(self, logits: torch.Tensor) -> torch.Tensor:
        """The no-speech token's probability in each row of ``logits`` [N, V] (0 where the
        vocabulary has no such token)."""
        token = self.rules.tok.no_speech
        if token is None:
            return logits.new_zeros(logits.shape[0], dtype=torch.float32)
        return torch.softmax(logits.float(), dim=-1)[:, token]

    def _first_step_no_speech(self, logits: torch.Tensor, first: list[int]) -> torch.Tensor | None:
        """[rows] holding the no-speech probability of the rows at their first step (those whose
        prompt ends with <|startoftranscript|> read it from this step's logits, the others took
        it at admission); None when no row is at its first step."""
        if not first:
            return None
        values = torch.zeros(len(self.windows), dtype=torch.float32, device=self.device)
        now = [row for row in first if self.windows[row].no_speech_at_admission is None]
        if now:
            values[now] = self._no_speech(logits[now])
        for row in first:
            if self.windows[row].no_speech_at_admission is not None:
                values[row] = self.windows[row].no_speech_at_admission
        return values

    def remove(self, rows: list[int]) -> list[Window]:
        """Drop rows (highest first so indices stay valid), moving the last row into each hole."""
        removed = []
        for row in sorted(set(rows), reverse=True):
            last = len(self.windows) - 1
            removed.append(self.windows[row])
            if row != last:
                for tensors in (self.self_kv, self.cross_kv):
                    for k, v in tensors:
                        k[row] = k[last]
                        v[row] = v[last]
                self.windows[row] = self.windows[last]
                self.lengths[row] = self.lengths[last]
                self.feed[row] = self.feed[last]
            self.windows.pop()
            self.lengths.pop()
            self.feed.pop()
        return removed
