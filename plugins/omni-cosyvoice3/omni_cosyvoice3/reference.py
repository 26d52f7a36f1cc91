"""The reference audio cosyvoice3 clones from: its FamilySpec declares these bounds (a voice is
not saved outside them) and the frontend holds every request's reference to them."""

from omni_core.hooks import ReferenceLimits

REFERENCE_LIMITS = ReferenceLimits(min_seconds=0.2, max_seconds=30.0, min_sample_rate=8000, max_sample_rate=192000)
