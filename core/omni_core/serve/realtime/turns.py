"""Server VAD: where turns of speech start and stop in a stream of 16 kHz audio.

Speech starts at the first window whose probability reaches ``threshold``; the turn's audio
begins ``prefix_padding_ms`` before it. It stops once windows stay below ``threshold - 0.15``
(a hysteresis, as Silero's own iterator, so a wavering probability does not cut a word) for
``silence_duration_ms``; the turn's audio ends there, the silence included. Audio outside turns
is kept only as far back as the prefix padding reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni_core.serve.realtime.vad import RATE, WINDOW, SpeechProbability

HYSTERESIS = 0.15


@dataclass
class ServerVad:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    # conversation sessions: a turn that ends asks for a response; one that starts cancels it
    create_response: bool = True
    interrupt_response: bool = True


@dataclass
class Boundary:
    """A turn started (``start`` sample) or stopped (``end`` sample) at a position of the stream."""

    kind: str  # "started" or "stopped"
    sample: int


class TurnDetector:
    def __init__(self, settings: ServerVad):
        self.settings = settings
        self.probability = SpeechProbability()
        self.speaking = False
        self.windows = 0  # windows judged so far
        self._quiet_windows = 0

    def feed(self, samples: np.ndarray) -> list[Boundary]:
        """The turn boundaries that ``samples`` (the stream's next audio) complete, in order."""
        settings = self.settings
        silence_windows = max(1, round(settings.silence_duration_ms * RATE / 1000 / WINDOW))
        out = []
        for probability in self.probability.feed(samples):
            start = self.windows * WINDOW
            self.windows += 1
            if not self.speaking:
                if probability >= settings.threshold:
                    self.speaking = True
                    self._quiet_windows = 0
                    padding = settings.prefix_padding_ms * RATE // 1000
                    out.append(Boundary("started", max(0, start - padding)))
            elif probability < max(settings.threshold - HYSTERESIS, 0.01):
                self._quiet_windows += 1
                if self._quiet_windows >= silence_windows:
                    self.speaking = False
                    out.append(Boundary("stopped", self.windows * WINDOW))
            else:
                self._quiet_windows = 0
        return out
