"""Audio in and out: decode uploads, resample, and encode replies whole or as a stream.

Encoding and decoding go through libsndfile (soundfile): wav, flac, mp3 and ogg (opus, vorbis).
``pcm`` is raw 16-bit little-endian mono. aac has no encoder in libsndfile, so asking for it is a
clear 400 rather than a silent substitute.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct

import numpy as np
import soundfile as sf
import soxr

from omni_core.hooks import InputTooLarge, InvalidInput

CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# format -> (libsndfile container, subtype); opus only runs at these sample rates
_SNDFILE = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS"), "flac": ("FLAC", "PCM_16")}
_OPUS_RATES = (48000, 24000, 16000, 12000, 8000)


class AudioDecodeError(InvalidInput):
    def __init__(self, message: str, param: str = "file"):
        super().__init__(message, param)


def check_output_format(fmt: str, param: str = "response_format") -> str:
    if fmt not in CONTENT_TYPES:
        raise InvalidInput(f"unsupported {param} {fmt!r}; choose one of {sorted(CONTENT_TYPES)}", param)
    if fmt == "aac":
        raise InvalidInput(
            "aac output needs an encoder this server does not have; use mp3, opus, flac, wav or pcm", param
        )
    if fmt in _SNDFILE:
        container, subtype = _SNDFILE[fmt]
        if subtype not in sf.available_subtypes(container):
            raise InvalidInput(f"{fmt} output is not supported by this build of libsndfile", param)
    return fmt


def decode_audio(data: bytes, max_seconds: float | None = None, param: str = "file") -> tuple[np.ndarray, int]:
    """Any format libsndfile reads (wav, flac, mp3, ogg...) -> float32 mono and its sample rate.
    With ``max_seconds``, reading stops as soon as the audio is longer (``InputTooLarge``): a few
    KB of compressed silence can hold hours, which would be decoded into memory in full."""
    if not data:
        raise AudioDecodeError("the audio is empty", param)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, declared = f.samplerate, f.frames
            most = None if max_seconds is None else int(max_seconds * rate)
            # Read in blocks: a streamed file's header may not know its length.
            blocks, frames = [], 0
            while True:
                block = f.read(65536, dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    break
                blocks.append(block)
                frames += block.shape[0]
                if most is not None and frames > most:
                    check_seconds(max(frames, declared) / rate, max_seconds, param, at_least=declared <= frames)
    except InvalidInput:
        raise
    except Exception as exc:  # libsndfile raises several types for garbage input
        # its messages name the in-memory file object ("Error opening <_io.BytesIO object at 0x...>: ...")
        reason = re.sub(r"^Error opening <[^>]*>: ", "", str(exc))
        raise AudioDecodeError(f"could not decode the audio ({reason})", param) from None
    audio = np.concatenate(blocks) if blocks else np.zeros((0, 1), np.float32)
    if audio.shape[0] == 0:
        raise AudioDecodeError("the audio has no samples", param)
    return np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32), int(rate)


def check_seconds(seconds: float, max_seconds: float, param: str, at_least: bool = False) -> None:
    """``InputTooLarge`` (413) for audio longer than ``max_seconds``; ``at_least``: reading
    stopped there, the whole may be longer."""
    if seconds > max_seconds:
        length = f"over {max_seconds:g} s long" if at_least else f"{seconds:.1f} s long"
        raise InputTooLarge(f"{param} is {length}; this server accepts at most {max_seconds:g} s", param)


def resample(audio: np.ndarray, rate: int, target: int | None) -> np.ndarray:
    if target is None or rate == target:
        return audio
    return soxr.resample(audio, rate, target).astype(np.float32, copy=False)


_DATA_URL = re.compile(r"^data:(?P<mime>[\w/+.-]*)(;[\w=-]+)*;base64,(?P<data>.*)$", re.S)


def decode_base64(value: str, param: str) -> bytes:
    """Plain base64 or a ``data:<mime>;base64,`` URL -> bytes (400 on anything else)."""
    match = _DATA_URL.match(value)
    payload = match.group("data") if match else value
    if not match and value.startswith(("http://", "https://")):
        raise InvalidInput(
            f"{param}: remote URLs are not fetched; send the bytes as base64 or a data URL", param
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{param} is not valid base64 or a base64 data URL", param) from None


def _int16(audio: np.ndarray) -> np.ndarray:
    # One conversion for every format (libsndfile's own differs between wav and flac), so pcm,
    # wav and flac carry identical samples.
    return np.clip(np.rint(audio * 32767.0), -32768, 32767).astype("<i2")


def _to_int16(audio: np.ndarray) -> bytes:
    return _int16(audio).tobytes()


def _wav_stream_header(rate: int) -> bytes:
    # Sizes are unknown while streaming; 0xFFFFFFFF is what players accept for "until the end".
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", unknown)
    )


class StreamEncoder:
    """Encodes float32 chunks as they arrive; ``feed`` and ``close`` return the new bytes only.

    A streamed flac or mp3 cannot carry the length/seek headers the encoder writes on close, as
    with any live stream: players handle that, libsndfile's own reader does not.
    """

    def __init__(self, fmt: str, rate: int, out_rate: int | None = None):
        """``rate``: the chunks'; ``out_rate``: the stream's, if another (resampled as they come)."""
        self.fmt = check_output_format(fmt)
        self.in_rate = rate
        self.rate = out_rate or rate
        if fmt == "opus" and self.rate not in _OPUS_RATES:
            self.rate = 48000
        self._resampler = (
            soxr.ResampleStream(rate, self.rate, 1, dtype="float32") if self.rate != rate else None
        )
        self._resampler_flushed = False
        self._header_sent = False
        self._buffer: io.BytesIO | None = None
        self._file: sf.SoundFile | None = None
        self._sent = 0
        if fmt in _SNDFILE:
            container, subtype = _SNDFILE[fmt]
            self._buffer = io.BytesIO()
            self._file = sf.SoundFile(self._buffer, "w", self.rate, 1, format=container, subtype=subtype)

    def _take_new(self) -> bytes:
        data = self._buffer.getbuffer()
        new = bytes(data[self._sent :])
        self._sent = len(data)
        del data
        return new

    def feed(self, audio: np.ndarray, last: bool = False) -> bytes:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if self._resampler is not None and not self._resampler_flushed:
            audio = self._resampler.resample_chunk(audio, last=last)
            self._resampler_flushed = last
        if self.fmt == "pcm":
            return _to_int16(audio)
        if self.fmt == "wav":
            head = b"" if self._header_sent else _wav_stream_header(self.rate)
            self._header_sent = True
            return head + _to_int16(audio)
        if audio.size:
            self._file.write(_int16(audio) if self.fmt == "flac" else audio)
        return self._take_new()

    def whole(self) -> bytes:
        """The finished file with the headers the encoder rewrote on close (not for streaming)."""
        return self._buffer.getvalue()

    def close(self) -> bytes:
        tail = b""
        if self._resampler is not None and not self._resampler_flushed:
            tail = self.feed(np.zeros(0, np.float32), last=True)
        if self.fmt == "wav" and not self._header_sent:
            tail += self.feed(np.zeros(0, np.float32))
        if self._file is not None and not self._file.closed:
            self._file.close()  # flushes the encoder; bytes it rewrites before _sent are already gone
            tail += self._take_new()
        return tail

    def discard(self) -> None:
        """Closes the encoder of a stream cut short (while its buffer is alive: left to the
        garbage collector, libsndfile's close would write into a freed buffer and log errors)."""
        if self._file is not None and not self._file.closed:
            self._file.close()


def encode_audio(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """Whole-file encoding (sizes in the wav header are exact)."""
    fmt = check_output_format(fmt)
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt == "pcm":
        return _to_int16(audio)
    if fmt == "wav":
        out = io.BytesIO()
        sf.write(out, _int16(audio), rate, format="WAV", subtype="PCM_16")
        return out.getvalue()
    encoder = StreamEncoder(fmt, rate)
    encoder.feed(audio, last=True)
    encoder.close()
    return encoder.whole()
