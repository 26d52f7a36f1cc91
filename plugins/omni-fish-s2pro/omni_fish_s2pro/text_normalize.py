"""Text as S2-Pro's training text was cleaned (the reference cleans its training transcripts so,
and speaks inference text as given): curly single quotes made straight, emoji dropped (they have
no sound), runs of commas made one, and the ends stripped. Speaker tags and other markup pass."""

from __future__ import annotations

import re

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'"})
# emoticons, pictographs, transport and map symbols, regional indicator (flag) letters
_EMOJI = re.compile("[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]+")
_COMMAS = re.compile(r",{2,}")


def normalize_text(text: str) -> str:
    return _COMMAS.sub(",", _EMOJI.sub("", text.translate(_QUOTES))).strip()
