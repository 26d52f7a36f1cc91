"""Fish Audio S2-Pro for omni: dual-AR text to speech with zero-shot voice cloning."""
