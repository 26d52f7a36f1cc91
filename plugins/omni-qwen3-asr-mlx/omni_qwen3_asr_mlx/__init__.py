"""Qwen3-ASR speech recognition for omni, on MLX."""

from .blas import prefer_openblas

__version__ = "0.1.0"

prefer_openblas()  # before any module of this package imports mlx.core
