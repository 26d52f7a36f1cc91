"""The contract's error for bad request content: a family's stage raises ``InvalidInput`` (naming
the field in ``param``) to refuse a request; the server answers 400 with its message (413 for
``InputTooLarge``), the offline API raises it as is. It lives with the contract, not the HTTP
layer, so a family depends on nothing above the hooks to refuse its input."""

from __future__ import annotations


class InvalidInput(ValueError):
    """``raise InvalidInput("text is empty", param="input")``: the request fails alone with a 400
    whose message is ``message``; ``param`` names the request field at fault (OpenAI's error
    ``param``) and ``code`` goes to the error's ``code``."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InputTooLarge(InvalidInput):
    """As ``InvalidInput``, answered 413: the input is well formed but larger than the family takes."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, code="too_large")
