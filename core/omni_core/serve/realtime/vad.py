"""Voice activity detection with Silero VAD's ONNX model (the ``silero-vad`` package ships it;
onnxruntime runs it): the probability that each 32 ms window of 16 kHz audio is speech.

The model is recurrent: each window is given with the last 64 samples before it and the state
the previous window left, so one ``SpeechProbability`` follows one stream of audio. The ONNX
session is loaded once per process and shared (it keeps no state of its own).
"""

from __future__ import annotations

import functools
import importlib.resources

import numpy as np

RATE = 16000
WINDOW = 512  # samples a window at 16 kHz (the model's size)
CONTEXT = 64  # samples of the window before, given with each window
MODEL_FILE = "silero_vad.onnx"


class VadUnavailable(RuntimeError):
    """The realtime extra (silero-vad, onnxruntime) is not installed."""


@functools.cache
def _session():
    try:
        import onnxruntime

        model = importlib.resources.files("silero_vad.data") / MODEL_FILE
        options = onnxruntime.SessionOptions()
        # one window is a few thousand multiply-adds: threads would cost more than they save
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        with importlib.resources.as_file(model) as path:
            return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except (ImportError, FileNotFoundError) as exc:
        raise VadUnavailable(
            f"server voice activity detection needs silero-vad and onnxruntime: "
            f"pip install 'omni-core[realtime]' ({exc})"
        ) from None


def load() -> None:
    """Loads the model now (raises ``VadUnavailable`` when it cannot be)."""
    _session()


class SpeechProbability:
    """Speech probability of each full window of a 16 kHz stream, fed in pieces of any size."""

    def __init__(self):
        self._session = _session()
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)

    def feed(self, samples: np.ndarray) -> list[float]:
        """One probability per window completed by ``samples`` (the rest waits for more)."""
        self._pending = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        out = []
        rate = np.array(RATE, np.int64)
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            frame = np.concatenate([self._context, window])[None, :]
            probability, self._state = self._session.run(
                None, {"input": frame, "state": self._state, "sr": rate}
            )
            self._context = window[-CONTEXT:]
            out.append(float(probability[0, 0]))
        return out
