"""Real `omni serve` subprocesses on 127.0.0.1 for end-to-end tests of any family: the server of
omni-core's testing kit (omni_core.testing), which plugin authors use too."""

from omni_core.testing import OmniServer, free_port

__all__ = ["OmniServer", "free_port"]
