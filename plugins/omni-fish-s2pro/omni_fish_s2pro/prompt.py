"""S2-Pro's prompt: a chat of three turns in ChatML, the voice given in the system turn.

    <|im_start|>system\\n{instruction}<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n<|voice|>

Without a reference the instruction is ``convert the provided text to speech``. With one it is
``convert the provided text to speech reference to the following:\\n\\nText:\\n`` + the
reference transcript (tagged ``<|speaker:0|>`` unless it carries a speaker tag) +
``\\n\\nSpeech:\\n`` + one semantic token per reference frame: ``<|semantic:c|>`` where ``c`` is
the frame's code 0. Those positions are frames: the slow AR reads all their codes
(``slow_ar``). Each piece is tokenized on its own, as the reference builds the sequence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .config import IM_END, IM_START, VOICE, TokenIds

PLAIN_INSTRUCTION = "convert the provided text to speech"
CLONING_INSTRUCTION = "convert the provided text to speech reference to the following:\n\nText:\n"
SPEECH_HEADER = "\n\nSpeech:\n"
_SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")


# control tokens a text may not carry: they would end its turn or forge frames (speaker tags may)
RESERVED = (IM_START, IM_END, VOICE, "<|semantic:")


def reserved_in(text: str) -> str | None:
    """The first control token ``text`` carries, or None."""
    return next((token for token in RESERVED if token in text), None)


@dataclass
class Prompt:
    token_ids: list[int]
    frames: torch.Tensor  # [num_codebooks, n]: the codes of the prompt's frames, in order
    turn_start: int = 0  # where the user's turn begins (after the system turn and its frames)


def build_prompt(
    tokenizer,
    ids: TokenIds,
    text: str,
    reference_text: str | None = None,
    reference_codes: torch.Tensor | None = None,
    num_codebooks: int = 10,
) -> Prompt:
    """``reference_codes`` [num_codebooks, frames]: the reference audio's, from the codec."""

    def encode(piece: str) -> list[int]:
        return tokenizer.encode(piece, add_special_tokens=False).ids

    tokens = encode(f"{IM_START}system\n")
    frames = torch.zeros(num_codebooks, 0, dtype=torch.int64)
    if reference_codes is not None:
        transcript = reference_text or ""
        if not _SPEAKER_TAG.search(transcript):
            transcript = "<|speaker:0|>" + transcript
        tokens += encode(CLONING_INSTRUCTION) + encode(transcript) + encode(SPEECH_HEADER)
        frames = reference_codes.to(torch.int64)
        tokens += [ids.semantic_begin + int(c) for c in frames[0]]
    else:
        tokens += encode(PLAIN_INSTRUCTION)
    tokens += encode(f"{IM_END}\n")
    turn_start = len(tokens)
    tokens += encode(f"{IM_START}user\n") + encode(text) + encode(f"{IM_END}\n")
    tokens += encode(f"{IM_START}assistant\n{VOICE}")
    return Prompt(tokens, frames, turn_start)
