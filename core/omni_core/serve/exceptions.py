"""Input errors raised below the HTTP layer (also by the offline ``Omni`` API); the server maps
``InvalidInput`` to 400 and ``InputTooLarge`` to 413."""

from __future__ import annotations


class InvalidInput(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InputTooLarge(InvalidInput):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, code="too_large")
