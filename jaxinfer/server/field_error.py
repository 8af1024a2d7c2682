"""``FieldError``: a request field's value is refused, answered as a 400 whose ``param`` is the field."""

from __future__ import annotations


class FieldError(ValueError):
    """A request field's value is refused: a 400 whose ``param`` is ``field``."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
