"""Reading JSON that comes from outside: one parser, with limits on depth and size.

Every place that decodes JSON a client sent goes through `loads`: the REST and wire APIs
(toolhub.parsers), a call's `arguments` text, `/mcp/`, WebSocket messages, the admin's
and the console's forms (`JSONFormField` for every admin JSONField). What it refuses
raises `JsonInputError`, a ValueError with a short message that never quotes the input,
which each entry point answers as its own 400, form error or protocol error, never as a
500 with a traceback.

Why a depth limit: `json.loads` recurses (in C) once per nested array or object and
raises RecursionError, not ValueError, past about a thousand levels, so 20,000 brackets
were a 500 wherever only ValueError was caught; and what it returns is walked by
recursive code (pydantic, redaction, argument shapes, `json.dumps`) with the same
limit. MAX_DEPTH is 64: far deeper than tool arguments, JSON Schemas or MCP messages
nest in practice (an MCP `tools/call` wraps the arguments in three more levels), and
far below any recursion limit. Text over the limit is refused before `json.loads`
sees it.

Why it stays cheap: text with at most MAX_DEPTH opening brackets cannot nest deeper,
and counting them is two `str.count` calls, so a typical call body is never scanned
(about 0.1 µs on 200 bytes). Only text with more brackets is scanned, by one regular
expression that steps from bracket to bracket over strings and everything else: one
step per bracket (O(containers), no recursion), stopping at the first level past the
limit. The size limit defaults to TOOLHUB_MAX_REQUEST_BYTES, the request body limit.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

MAX_DEPTH: Final = 64
# Text this short is within every body limit (settings refuse one under 1,024 bytes), so
# its size is not checked: reading a setting costs more than parsing a small body.
_ALWAYS_SMALL: Final = 256

# One step: any run of complete strings and other characters, then what ends it: a
# bracket, a quote that opens no complete string (the text is not JSON from there), or
# the end. Possessive, so a step never backtracks; and it matches at every position, so
# finditer never starts again one character further on (which would be quadratic).
_STEP: Final = re.compile(r'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"|[^"\[\]{}]++)*+([\[\]{}"]|\Z)', re.S)
_OPENING: Final = frozenset("[{")
_CLOSING: Final = frozenset("]}")


class JsonInputError(ValueError):
    """JSON that `loads` refuses. The message is one short sentence, safe to show the
    sender; `limit` tells text over a limit from text that is not JSON at all."""

    def __init__(self, message: str, *, limit: bool = False) -> None:
        super().__init__(message)
        self.limit = limit


def _refuse_constant(name: str) -> Any:
    raise JsonInputError(f"Not valid JSON: {name} is not a JSON value.")


# Strict JSON (RFC 8259): NaN and Infinity, which json.loads accepts, are refused, as
# DRF's parser did (and as PostgreSQL's jsonb would, later and as a 500).
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)


def loads(
    text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, max_bytes: int | None = None
) -> Any:
    """The value of `text`, JSON nested at most `max_depth` levels and at most
    `max_bytes` long (default TOOLHUB_MAX_REQUEST_BYTES); JsonInputError otherwise."""
    if max_bytes is not None or len(text) > _ALWAYS_SMALL:
        _check_size(text, settings.TOOLHUB_MAX_REQUEST_BYTES if max_bytes is None else max_bytes)
    if not isinstance(text, str):
        try:  # as json.loads reads bytes: UTF-8, or UTF-16/32 told by its first bytes
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        except UnicodeDecodeError:
            raise JsonInputError("Not valid JSON: the bytes are not UTF-8 text.") from None
    if text.count("[") + text.count("{") > max_depth and _nested_deeper(text, max_depth):
        raise _too_deep(max_depth)
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise JsonInputError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except RecursionError:  # only on a stack already deep: the text was scanned
        raise _too_deep(max_depth) from None


def _check_size(text: str | bytes | bytearray, max_bytes: int) -> None:
    # A character is 1 to 4 bytes in UTF-8: encode only when that could matter.
    if len(text) > max_bytes or (
        isinstance(text, str)
        and len(text) * 4 > max_bytes
        and len(text.encode("utf-8", "surrogatepass")) > max_bytes
    ):
        raise JsonInputError(f"The JSON is larger than {max_bytes} bytes.", limit=True)


def _nested_deeper(text: str, max_depth: int) -> bool:
    depth = 0
    for step in _STEP.finditer(text):
        mark = step[1]
        if mark in _OPENING:
            depth += 1
            if depth > max_depth:
                return True
        elif mark in _CLOSING:
            depth -= 1  # below zero is not JSON: the decoder stops there
        else:
            # The end, or a string left open: the decoder stops there, no deeper.
            return False
    return False


def _too_deep(max_depth: int) -> JsonInputError:
    return JsonInputError(f"The JSON is nested deeper than {max_depth} levels.", limit=True)


class JSONFormField(forms.JSONField):
    """Django's JSON form field reading with `loads`: JSON nested too deeply is a form
    error, not a 500. The admin uses it for every model JSONField (ScopedChoicesMixin)."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values:
            return super().to_python(value)
        if isinstance(value, (list, dict, int, float, forms.fields.JSONString)):
            return value
        try:
            converted = loads(value)
        except JsonInputError as exc:
            message = str(exc) if exc.limit else self.error_messages["invalid"]
            raise ValidationError(message, code="invalid") from None
        return forms.fields.JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        """What a form shown again with its errors holds: the text as typed when refused."""
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        try:
            return loads(data)
        except JsonInputError:
            return forms.fields.InvalidJSONInput(data)
