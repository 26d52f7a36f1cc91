"""The reference audio S2-Pro clones from: its FamilySpec declares these bounds (a voice is not
saved outside them) and the frontend holds every request's reference to them. A clip shorter
than half a second gives the codec ten frames at most; one past 30 s makes a prompt of more
than 640 frames for the slow AR to read on every request."""

from omni_core.hooks import ReferenceLimits

REFERENCE_LIMITS = ReferenceLimits(
    min_seconds=0.5, max_seconds=30.0, min_sample_rate=8000, max_sample_rate=192000
)
