"""What the talker's prompt is made of, and the rule that feeds it the reply's text.

The talker reads every token of the chat's user turns (their text as the thinker embedded it,
through ``text_projection``; their audio, image and video positions as the thinker's
``accept_hidden_layer`` states, through ``hidden_projection``), then the assistant turn: its
three opening tokens, four ``tts_pad`` rows over the codec's nothink / think-bos / think-eos /
speaker ids, ``tts_bos`` over the codec pad, and the reply's first token over the codec bos.
Each talker step after that adds the next reply token's projected embedding (``trailing``):
reply token ``j + 1`` at step ``j``, ``tts_eos`` after the last one, ``tts_pad`` from then on.
The reply's last token is never voiced (the thinker never embeds it: it is usually the end of
turn), so a token is usable once the token after it has come; ``tts_eos`` takes its place.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import OmniCheckpoint
from .prompt import MediaItem, rope_positions

ASSISTANT_OPENING = 3  # <|im_start|> assistant \n: the assistant part's first rows


@dataclass(frozen=True)
class SpeechIds:
    """The ids the speech half reads from config.json (``talker_config`` and the top level)."""

    im_start: int
    user: int
    assistant: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    speakers: dict[str, int]
    accept_hidden_layer: int
    num_code_groups: int
    codec_vocab: int

    @classmethod
    def of(cls, ckpt: OmniCheckpoint) -> SpeechIds:
        config = ckpt.config
        talker = ckpt.speech_config("talker_config")
        return cls(
            im_start=int(config.im_start_token_id),
            user=int(config.user_token_id),
            assistant=int(config.assistant_token_id),
            tts_bos=int(config.tts_bos_token_id),
            tts_eos=int(config.tts_eos_token_id),
            tts_pad=int(config.tts_pad_token_id),
            codec_nothink=int(talker.codec_nothink_id),
            codec_think_bos=int(talker.codec_think_bos_id),
            codec_think_eos=int(talker.codec_think_eos_id),
            codec_pad=int(talker.codec_pad_id),
            codec_bos=int(talker.codec_bos_id),
            codec_eos=int(talker.codec_eos_token_id),
            speakers={str(k).lower(): int(v) for k, v in dict(talker.speaker_id or {}).items()},
            accept_hidden_layer=int(talker.accept_hidden_layer),
            num_code_groups=int(talker.num_code_groups),
            codec_vocab=int(talker.text_config.vocab_size),
        )

    @property
    def default_speaker(self) -> str:
        return "ethan" if "ethan" in self.speakers else next(iter(self.speakers))

    def suppressed(self) -> list[int]:
        """Codec ids the talker never samples: the 1024 specials past the codebook, but its eos."""
        return [i for i in range(max(0, self.codec_vocab - 1024), self.codec_vocab) if i != self.codec_eos]


def talker_plan(ckpt: OmniCheckpoint, speech: SpeechIds, ids: list[int], media: list[MediaItem], speaker: int) -> dict:
    """What the thinker forwards to the talker with a request's first reply tokens: the user
    turns' ids (``user_ids``), which of them are media rows (``media_rows``) and where those sit
    in the prompt (``media_positions``: the thinker sends its states there), the assistant
    turn's ids, the speaker's codec id and the talker prompt's rotary positions (None: 0..L-1)."""
    tokens = ckpt.tokens
    pads = {tokens.audio, tokens.image, tokens.video}
    role, user_index = None, []
    for i, token in enumerate(ids):
        if token == speech.im_start and i + 1 < len(ids):
            role = ids[i + 1]
        if role == speech.user:
            user_index.append(i)
    starts = [i for i in range(len(ids) - 1) if ids[i] == speech.im_start and ids[i + 1] == speech.assistant]
    if not starts:
        raise ValueError("the chat template opens no assistant turn")
    assistant = starts[-1]
    user_ids = [ids[i] for i in user_index]
    media_rows = [j for j, token in enumerate(user_ids) if token in pads]
    # the media items of the user turns, in order (media elsewhere is not read by the talker)
    in_user = set(user_index)
    user_media = [item for item, first in _media_owners(ids, media, pads) if first in in_user]
    talker_ids = user_ids + [speech.tts_pad] * (ASSISTANT_OPENING + 6)
    positions = rope_positions(ckpt, talker_ids, user_media)
    return {
        "user_ids": user_ids,
        "media_rows": media_rows,
        "media_positions": [user_index[j] for j in media_rows],
        "assistant_ids": ids[assistant:],
        "speaker": speaker,
        "rope_positions": positions,
    }


def _media_owners(ids: list[int], media: list[MediaItem], pads: set[int]) -> list[tuple[MediaItem, int]]:
    """Each media item with its first prompt position."""
    out, items, i = [], iter(media), 0
    while i < len(ids):
        if ids[i] in pads:
            item = next(items)
            out.append((item, i))
            i += item.rows
        else:
            i += 1
    return out


def first_text_ready(spoken: list[int]) -> bool:
    """Whether the talker's prompt can be made: its last row, ``spoken[3]``, is usable."""
    return ASSISTANT_OPENING + 1 < len(spoken)


def trailing_id(speech: SpeechIds, spoken: list[int], finished: bool, step: int) -> int | None:
    """The thinker id whose projected embedding the talker adds at decode ``step``, or None while
    it is not known yet. ``spoken``: the assistant turn's ids, opening then reply so far; its
    token ``4 + step``, then ``tts_eos`` in place of the last token, then ``tts_pad``."""
    index = ASSISTANT_OPENING + 1 + step
    if index + 1 < len(spoken):
        return spoken[index]
    if not finished:
        return None
    return speech.tts_eos if index == len(spoken) - 1 else speech.tts_pad


def assistant_text_ids(speech: SpeechIds, spoken: list[int]) -> list[int]:
    """Thinker ids of the talker prompt's assistant rows (their projected embeddings)."""
    return spoken[:ASSISTANT_OPENING] + [speech.tts_pad] * 4 + [speech.tts_bos, spoken[ASSISTANT_OPENING]]


def assistant_codec_ids(speech: SpeechIds, speaker: int) -> list[int | None]:
    """Codec ids added to the assistant rows (None: nothing added)."""
    return [None] * ASSISTANT_OPENING + [speech.codec_nothink, speech.codec_think_bos, speech.codec_think_eos, speaker, speech.codec_pad, speech.codec_bos]
