"""Whisper's tokenizer: byte-level BPE from ``tokenizer.json`` plus the special ids around it.

Timestamp tokens (one per 20 ms, from ``<|0.00|>``) follow ``<|notimestamps|>`` in the model's
vocabulary but are absent from most ``tokenizer.json`` files, so they are handled here by id.
"""

from __future__ import annotations

from pathlib import Path

from omni_core.hooks import InvalidInput
from tokenizers import Tokenizer

SECONDS_PER_TIMESTAMP = 0.02


class WhisperTokenizer:
    def __init__(self, directory: str | Path, vocab_size: int):
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a Whisper checkpoint needs its tokenizer.json")
        self.bpe = Tokenizer.from_file(str(path))
        self.vocab_size = vocab_size
        self.eot = self._id("<|endoftext|>")
        self.sot = self._id("<|startoftranscript|>")
        self.sot_prev = self._id("<|startofprev|>")
        self.no_timestamps = self._id("<|notimestamps|>")
        self.timestamp_begin = self.no_timestamps + 1
        self.transcribe = self._id("<|transcribe|>")
        self.translate = self._id("<|translate|>")
        # predicted after <|startoftranscript|> when a window holds no speech (older vocabularies
        # name it <|nocaptions|>); its probability there is Whisper's no_speech_prob
        vocab = self.bpe.get_vocab(with_added_tokens=True)
        self.no_speech = vocab.get("<|nospeech|>", vocab.get("<|nocaptions|>"))
        self.multilingual = vocab_size >= 51865
        self.languages = {
            token.strip("<|>"): token_id
            for token, token_id in vocab.items()
            if token.startswith("<|") and token.endswith("|>") and self.sot < token_id < self.transcribe - 1
            and 1 < len(token) - 4 <= 3
        }

    def _id(self, token: str) -> int:
        token_id = self.bpe.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer.json has no {token}")
        return token_id

    def encode(self, text: str) -> list[int]:
        return self.bpe.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special and timestamp tokens are dropped."""
        return self.bpe.decode([i for i in ids if i < self.eot], skip_special_tokens=True)

    def is_timestamp(self, token_id: int) -> bool:
        return token_id >= self.timestamp_begin

    def timestamp_seconds(self, token_id: int) -> float:
        return (token_id - self.timestamp_begin) * SECONDS_PER_TIMESTAMP

    def check_language(self, language: str | None) -> str | None:
        """The language code to decode with; None (a multilingual model, no language given): the
        decoder detects it. An English-only model accepts only English. A language is a code or
        its name ("German", any case; transformers' table of names and aliases)."""
        from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

        code = language.strip().lower() if language else None
        code = TO_LANGUAGE_CODE.get(code, code)
        if not self.multilingual:
            if code not in (None, "en"):
                raise InvalidInput(f"this checkpoint is English-only; language {language!r} is not supported")
            return "en"
        if code is None:
            return None
        if code not in self.languages:
            raise InvalidInput(f"unknown language {language!r}; known: {', '.join(sorted(self.languages))}")
        return code

    @staticmethod
    def language_name(code: str | None) -> str | None:
        """The name OpenAI's verbose_json gives a language code (``"en"`` -> ``"english"``: the
        table of Whisper's languages in transformers); None for a code it does not know."""
        from transformers.models.whisper.tokenization_whisper import LANGUAGES

        return LANGUAGES.get(code) if code else None

    def check_task(self, task: str) -> str:
        """Whisper's task token for an omni task: ``transcribe``, or ``translate`` (to English;
        multilingual checkpoints only)."""
        if task == "translation":
            if not self.multilingual:
                raise InvalidInput("this checkpoint is English-only: it transcribes English speech and cannot translate")
            return "translate"
        if task not in (None, "transcription"):
            raise InvalidInput(f"whisper does transcription and translation, not {task!r}")
        return "transcribe"

    def prompt(self, language: str, timestamps: bool, previous_text: str | None, max_prompt: int,
               task: str = "transcribe") -> list[int]:
        """``[<|startofprev|> prompt...] <|startoftranscript|> [lang task] [<|notimestamps|>]``."""
        tokens: list[int] = []
        if previous_text:
            # control tokens typed into a prompt are dropped: a prompt cannot end or steer the decode
            text_ids = [i for i in self.encode(" " + previous_text.strip()) if i < self.eot]
            tokens = [self.sot_prev, *text_ids[-max_prompt:]] if max_prompt > 0 else []
        tokens.append(self.sot)
        if self.multilingual:
            tokens += [self.languages[language], self.translate if task == "translate" else self.transcribe]
        if not timestamps:
            tokens.append(self.no_timestamps)
        return tokens
