"""omni-core: a serving runtime for multi-stage speech and omni models."""

__version__ = "0.1.0"


def __getattr__(name):
    # The offline API pulls in torch and the runtime; load it only when asked for.
    if name == "Omni":
        from omni_core.api import Omni

        return Omni
    raise AttributeError(name)


__all__ = ["Omni", "__version__"]
