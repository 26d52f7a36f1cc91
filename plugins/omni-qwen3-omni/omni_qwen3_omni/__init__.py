"""Qwen3-Omni for omni: the thinker (audio, image and video in, text out) as a stage graph."""
