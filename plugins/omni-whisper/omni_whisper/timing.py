"""Word timestamps from the decoder's cross-attention, the way Whisper derives them.

Once a window has decoded, one teacher-forced decoder pass over its prompt and tokens records
the cross-attention weights of the checkpoint's alignment heads (``alignment_heads``: layer,
head). Kept for the encoder frames the audio covers, standardised over the tokens for each
frame, median-filtered along time and averaged over the heads, they form a token x frame
similarity; dynamic time warping finds the monotonic path through it, and each row starts at the
first frame the path reaches on it, 20 ms a frame.

Words are runs of text tokens whose first token starts with a space; punctuation tokens join
the word before. As in Whisper, a token's row is the query that predicts it, so a word starts
at its first token's time and ends at the time of the token after it (the last word: where the
end of text is predicted). A pause before a word would otherwise count as part of the word: no
word starts more than twice the median word duration (at most 0.7 s) before its end, and none
that ends a sentence (or the text) ends more than that after its start.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import torch
from omni_core.models import native

from omni_whisper.model import WhisperModel
from omni_whisper.tokenizer import WhisperTokenizer

MEDIAN_WIDTH = 7
SECONDS_PER_FRAME = 0.02  # one encoder position
MAX_MEDIAN_WORD = 0.7  # s: the median word duration the pause rule assumes at most
SENTENCE_ENDS = (".", "!", "?", "。", "！", "？")
PUNCTUATION = set("\"'“¿([{-.。,，!！?？:：”)]}、")


def alignment_weights(model: WhisperModel, encoded: torch.Tensor | None, tokens: list[int], heads: list[list[int]],
                      cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """Cross-attention weights [heads, len(tokens), S] of ``tokens`` fed to the decoder at once,
    over the encoder output ``encoded`` [S, D], or over its cross-attention K/V where given
    (each [1, H, S, hd]: a decode batch's row)."""
    captured: list[torch.Tensor] = []
    if cross_kv is None:
        with torch.inference_mode():
            cross_kv = model.decoder.cross_kv(encoded[None])
    model.decode_sequence(tokens, cross_kv, cross_weights=captured)
    return torch.stack([captured[layer][0, head] for layer, head in heads]).float()


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd ``width`` along the last dimension, edges reflected.
    The window's values are sorted by an odd-even transposition network of element-wise min/max
    over whole shifted copies (exact; 3-4x faster on CPU than ``median`` over an unfolded window
    of 7, whose per-window work dominates at these sizes)."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    flat = x.reshape(-1, 1, x.shape[-1])  # reflect padding takes a 3-D input
    padded = torch.nn.functional.pad(flat, (half, half), mode="reflect").reshape(*x.shape[:-1], -1)
    length = x.shape[-1]
    window = [padded[..., k : k + length] for k in range(width)]
    for round_ in range(width):
        for k in range(round_ % 2, width - 1, 2):
            window[k], window[k + 1] = torch.minimum(window[k], window[k + 1]), torch.maximum(window[k], window[k + 1])
    return window[half]


@functools.cache
def _native_path():
    """``dtw_path`` of dtw.c, built on first use (None without a C compiler: numpy's then)."""
    pointer = np.ctypeslib.ndpointer
    return native.function(Path(__file__).with_name("dtw.c"), "dtw_path", [
        pointer(np.float64, flags="C_CONTIGUOUS"), ctypes.c_int, ctypes.c_int, pointer(np.float32, flags="C_CONTIGUOUS"),
        pointer(np.int8, flags="C_CONTIGUOUS"), pointer(np.int32, flags="C_CONTIGUOUS"), pointer(np.int32, flags="C_CONTIGUOUS"),
    ], ctypes.c_int)


def monotonic_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path from the top-left to the bottom-right of ``cost`` [N, M]
    (steps: diagonal, down, right; ties go right, then down). Returns its row and column indices.
    In C (dtw.c, under a millisecond for 70 x 1500) where a compiler is found, else in numpy."""
    fn = _native_path()
    if fn is None:
        return monotonic_path_numpy(cost)
    rows, cols = cost.shape
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    total = np.empty((rows + 1) * (cols + 1), dtype=np.float32)
    move = np.empty((rows + 1) * (cols + 1), dtype=np.int8)
    path_rows, path_cols = np.empty(rows + cols, dtype=np.int32), np.empty(rows + cols, dtype=np.int32)
    n = fn(cost, rows, cols, total, move, path_rows, path_cols)
    return path_rows[:n][::-1].astype(np.int64), path_cols[:n][::-1].astype(np.int64)


def monotonic_path_numpy(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``monotonic_path`` in numpy: cells on one anti-diagonal depend only on the two before, so
    each diagonal is one vector step."""
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    move = np.full((rows + 1, cols + 1), 2, dtype=np.int8)  # 0 diagonal, 1 down, 2 right
    total[0, 0] = 0
    for d in range(2, rows + cols + 1):
        i = np.arange(max(1, d - cols), min(rows, d - 1) + 1)
        j = d - i
        diag, down, right = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        pick = np.where((diag < down) & (diag < right), 0, np.where((down < diag) & (down < right), 1, 2))
        best = np.choose(pick, [diag, down, right])
        total[i, j] = cost[i - 1, j - 1] + best
        move[i, j] = pick
    move[0, :], move[:, 0] = 2, 1
    path_rows, path_cols = [], []
    i, j = rows, cols
    while i > 0 or j > 0:
        path_rows.append(i - 1)
        path_cols.append(j - 1)
        step = move[i, j]
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    return np.array(path_rows[::-1]), np.array(path_cols[::-1])


def token_times(weights: torch.Tensor, frames: int) -> np.ndarray:
    """Start time (s) of each token from its alignment weights [heads, tokens, S]; ``frames``: mel
    frames of the audio (two per encoder position)."""
    w = weights[:, :, : max(1, frames // 2)]
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = median_filter((w - mean) / std, MEDIAN_WIDTH).mean(dim=0)
    path_rows, path_cols = monotonic_path(-w.double().cpu().numpy())  # the warping runs on the host
    starts = np.pad(np.diff(path_rows), (1, 0), constant_values=1).astype(bool)
    return path_cols[starts] * SECONDS_PER_FRAME


def window_words(model: WhisperModel, tok: WhisperTokenizer, encoded: torch.Tensor, prompt: list[int],
                 tokens: list[int], heads: list[list[int]], offset: float, duration: float,
                 weights: torch.Tensor | None = None) -> list[dict]:
    """``[{"word", "start", "end"}]`` (seconds from the request's start) of a decoded window;
    ``weights``: its ``alignment_weights`` over prompt + text when already taken."""
    text = [t for t in tokens if t < tok.eot]
    if not text or not heads:
        return []
    if weights is None:
        weights = alignment_weights(model, encoded, [*prompt, *text], heads)
    # the rows of the queries that predict each text token and then the end of text: a token
    # starts where the query predicting it does, and the last word ends where the end is predicted
    weights = weights[:, len(prompt) - 1 :]
    # the text covers the audio up to the window's last timestamp (Whisper leaves the speech after
    # it to the next window): aligned over the whole window, the last words stretch to its end
    stamps = [tok.timestamp_seconds(t) for t in tokens if tok.is_timestamp(t)]
    if stamps and max(stamps) > 0:
        duration = min(duration, max(stamps))
    times = token_times(weights, int(duration * 100))
    spans: list[list] = []  # [word, first token, end token]
    for index, token in enumerate(text):
        piece = tok.decode([token])
        if spans and (not piece.startswith(" ") or piece.strip() in PUNCTUATION):
            spans[-1][0] += piece
            spans[-1][2] = index + 1
        else:
            spans.append([piece, index, index + 1])
    starts = np.array([times[a] for _, a, _ in spans])
    ends = np.array([times[b] for _, _, b in spans])
    # a pause next to a word aligns to the word: none lasts more than twice the median word
    # (capped); the pause after a sentence's last word (or the text's) is cut from its end, any
    # other pause from the start of the word after it
    longest = max(2 * min(MAX_MEDIAN_WORD, float(np.median(ends - starts))), SECONDS_PER_FRAME)
    final = np.array([word.strip().endswith(SENTENCE_ENDS) for word, _, _ in spans])
    final[-1] = True
    ends = np.where(final, np.minimum(ends, starts + longest), ends)
    starts = np.maximum(starts, ends - longest)
    return [
        {"word": word.strip(), "start": round(offset + float(min(start, duration)), 2), "end": round(offset + float(min(end, duration)), 2)}
        for (word, _, _), start, end in zip(spans, starts, ends, strict=True)
    ]
