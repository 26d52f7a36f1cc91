"""Generated tokens to streamed text: incremental detokenization and stop strings.

Each new token decodes a short window of the tokens before it (not the whole reply again), and
text whose last character is an incomplete UTF-8 sequence waits for the next token. Text that
could be the start of a stop string is held back until it is known not to be one; when a stop
string appears the reply ends before it.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.prefix_offset = 0  # tokens decoded for context only
        self.read_offset = 0  # tokens whose text is in ``text``
        self.text = ""  # decoded so far
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_ids: list[int]) -> str:
        """The text delta the new tokens give (may be empty); after a stop string, nothing."""
        if self.stopped:
            return ""
        self.tokens.extend(token_ids)
        before = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        after = self._decode(self.tokens[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return self._release(final=False)

    def finish(self) -> str:
        """What is left to hand out at the end of the reply."""
        if not self.stopped and self.read_offset < len(self.tokens):
            tail = self._decode(self.tokens[self.prefix_offset :])
            head = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            self.text += tail[len(head) :]
            self.read_offset = len(self.tokens)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        for stop in self.stop:
            # a stop string can only start in text not yet handed out (held back until now)
            at = self.text.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0:
                self.text = self.text[:at]
                self.stopped = True
        if self.stopped or final:
            end = len(self.text)
        else:
            end = max(self.sent, len(self.text) - self.hold) if self.stop else len(self.text)
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
