"""The input errors the server maps to 400 (``InvalidInput``) and 413 (``InputTooLarge``); they
belong to the plugin contract (``omni_core.hooks``), named here for the HTTP layer's users."""

from omni_core.hooks.errors import InputTooLarge, InvalidInput

__all__ = ["InputTooLarge", "InvalidInput"]
