"""Qwen3-ASR speech recognition for omni, on MLX."""

__version__ = "0.1.0"
