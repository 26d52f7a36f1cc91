"""omni-whisper: OpenAI Whisper speech recognition for omni (family ``whisper``)."""

__version__ = "0.1.0"
