"""Where a family's checkpoint comes from: a directory, a Hugging Face id, or a named preset."""

from __future__ import annotations

from pathlib import Path

from omni_core.cache import cache_root
from omni_core.hooks import FamilySpec


class CheckpointNotFound(RuntimeError):
    """No checkpoint given and the family's default one is neither cached nor downloadable."""


def resolve_checkpoint(
    spec: FamilySpec, model: str | None = None, preset: str | None = None, cache_dir: str | None = None
) -> str:
    """A local checkpoint directory for ``model`` (a path or a Hugging Face id), a ``preset``,
    or, with neither, the family's default checkpoint (Hugging Face cache first)."""
    if model and preset:
        raise ValueError("give either model or preset, not both")
    if preset:
        if preset not in spec.presets:
            raise ValueError(
                f"family {spec.name!r} has no preset {preset!r}; presets: {sorted(spec.presets) or 'none'}"
            )
        root = Path(cache_dir) if cache_dir else cache_root()
        target = root / "presets" / spec.name / preset
        target.mkdir(parents=True, exist_ok=True)
        return str(spec.presets[preset](str(target)))
    if model and Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    if model and _looks_like_a_path(model):  # not a Hugging Face id: say what is wrong with the path
        what = "is a file, not a checkpoint directory" if Path(model).expanduser().exists() else "no such directory"
        raise CheckpointNotFound(f"model {model!r}: {what}")
    repo = model or spec.default_checkpoint
    if not repo:
        raise CheckpointNotFound(
            f"family {spec.name!r} has no default checkpoint: pass --model PATH or --preset tiny"
        )
    if Path(repo).expanduser().is_dir():  # a family may ship its default checkpoint in a wheel
        return str(Path(repo).expanduser().resolve())
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, local_files_only=True, cache_dir=cache_dir)
    except Exception:
        pass
    try:
        return snapshot_download(repo, cache_dir=cache_dir)
    except Exception as exc:
        raise CheckpointNotFound(
            f"checkpoint {repo!r} is not cached and could not be downloaded ({type(exc).__name__}); "
            f"pass --model PATH_TO_CHECKPOINT, or --preset tiny for random weights"
        ) from None


def _looks_like_a_path(model: str) -> bool:
    """A Hugging Face id is ``name`` or ``owner/name``; anything rooted, relative to ``.``/``~``,
    or with more parts is a path."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model
