"""Prompts, language names and the streaming detokenizer of one transcription chunk.

The model answers ``language English<asr_text>the words``. A forced language is written into the
prompt (``...assistant\\nlanguage English<asr_text>``) so the model writes only the words;
otherwise the ``language X`` prefix is held back from the stream and parsed.
"""

from __future__ import annotations

from omni_core.hooks import InvalidInput

ASR_MARKER = "<asr_text>"
# the prefix the model writes before the marker is a few tokens; past this, there is no prefix
PREFIX_TOKEN_LIMIT = 16

LANGUAGES = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish",
    "nl": "Dutch", "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French",
    "de": "German", "el": "Greek", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "mk": "Macedonian", "ms": "Malay",
    "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}
_BY_NAME = {name.lower(): name for name in LANGUAGES.values()}
_CODE_BY_NAME = {name: code for code, name in LANGUAGES.items()}
# languages written without spaces between words: chunk texts join without a separator
UNSPACED = {"Chinese", "Cantonese", "Japanese", "Thai"}


def language_name(value: str | None) -> str | None:
    """ISO code or English name -> the name the model was trained with; InvalidInput if unknown."""
    if value is None or not value.strip():
        return None
    key = value.strip().lower()
    if key in LANGUAGES:
        return LANGUAGES[key]
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise InvalidInput(f"unsupported language {value!r}; supported: {', '.join(sorted(LANGUAGES))}")


def language_code(name: str | None) -> str | None:
    return _CODE_BY_NAME.get(name, name.lower() if name else None)


def build_prompt(audio_tokens: int, context: str | None, language: str | None) -> str:
    forced = f"language {language}{ASR_MARKER}" if language else ""
    return (
        f"<|im_start|>system\n{context or ''}<|im_end|>\n"
        f"<|im_start|>user\n<|audio_start|>{'<|audio_pad|>' * audio_tokens}<|audio_end|><|im_end|>\n"
        f"<|im_start|>assistant\n{forced}"
    )


class ChunkText:
    """Turns one chunk's generated tokens into text deltas, holding back an unparsed prefix and
    incomplete UTF-8 sequences. The deltas it returns always add up to ``text``."""

    def __init__(self, tokenizer, language: str | None):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.language = language
        self.prefix_done = language is not None
        self.body_start = 0  # character offset of the words in the decoded output
        self.text = ""  # what has been handed out

    def _decode(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        self.tokens.append(token)
        decoded = self._decode()
        if not self.prefix_done:
            marker = decoded.find(ASR_MARKER)
            if marker >= 0:
                self._parse_prefix(decoded[:marker])
                self.body_start = marker + len(ASR_MARKER)
            elif len(self.tokens) >= PREFIX_TOKEN_LIMIT:
                self.prefix_done = True
            else:
                return ""
        if decoded.endswith("\ufffd"):
            return ""
        return self._advance(decoded)

    def finish(self) -> str:
        decoded = self._decode() if self.tokens else ""
        if not self.prefix_done:
            marker = decoded.find(ASR_MARKER)
            if marker >= 0:
                self._parse_prefix(decoded[:marker])
                self.body_start = marker + len(ASR_MARKER)
            self.prefix_done = True
        return self._advance(decoded)

    def _advance(self, decoded: str) -> str:
        body = decoded[self.body_start :]
        if not self.text:
            body = body.lstrip()
            self.body_start = len(decoded) - len(body)
        if body.startswith(self.text):
            delta = body[len(self.text) :]
        else:  # an earlier replacement character resolved differently; keep what was sent
            delta = body[len(self.text) :] if len(body) > len(self.text) else ""
        self.text += delta
        return delta

    def _parse_prefix(self, prefix: str) -> None:
        self.prefix_done = True
        line = prefix.strip()
        if line.lower().startswith("language "):
            line = line[len("language ") :].strip()
        self.language = None if line.lower() in ("", "none") else line
