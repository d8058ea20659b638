"""Reading JSON that comes from outside: one parser, with limits on depth and size.

Every place that decodes JSON a client sent goes through `loads`: the REST and wire APIs
(toolhub.web.parsers), a call's `arguments` text, `/mcp/`, WebSocket messages, the admin's
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
and counting them is two `str.count` calls, so a typical call body is never scanned (a
180-byte body: json.loads 3.5 µs, `loads` +0.2 µs, CPU time on the 2-core test machine;
toolhub.web.parsers is 4 µs faster than DRF's parser, which built a decoder per call). Other
text is scanned with no recursion and no Python step per character: C string operations
drop escaped quotes, keep only quotes and brackets, and drop what lies inside strings;
then a shallow document is recognised by removing innermost pairs (n levels are gone
after n passes), and anything else by summing the brackets a chunk at a time, stopping
at the first chunk past the limit. That adds a third of json.loads' time to a 2 KB
body of 123 containers, four fifths to 30 streamed tool-call chunks (their escaped quotes
take a pass of their own); 20,000 brackets are refused in 0.3 ms and 1 MB of them in
4 ms, before json.loads sees them. The size limit defaults to TOOLHUB_MAX_REQUEST_BYTES,
the request body limit.
"""

from __future__ import annotations

import json
from array import array
from itertools import accumulate
from typing import Any, Final

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

MAX_DEPTH: Final = 64
# Text this short is within every body limit (settings refuse one under 1,024 bytes), so
# its size is not checked: reading a setting costs more than parsing a small body.
_ALWAYS_SMALL: Final = 256

# The depth scan works on bytes: brackets become +1 and -1 (signed bytes), quotes stay,
# everything else goes.
_SHAPE: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_SHAPE: Final = bytes(sorted(set(range(256)) - set(b'[{]}"')))
_QUICK_PASSES: Final = 12
_CHUNK: Final = 4096  # brackets summed at a time: the scan stops within one past the limit


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
    """Whether the brackets outside strings nest deeper than `max_depth`: C string
    operations over the text, then a running sum over the brackets alone."""
    data = text.encode("utf-8", "surrogatepass")
    if b'\\"' in data:  # escapes as JSON reads them: \\ first; an escaped quote is no quote
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Quotes and brackets only. Two quotes side by side enclose no bracket: dropping them
    # leaves every bracket as much inside or outside a string as it was.
    shape = data.translate(_SHAPE, _NOT_SHAPE).replace(b'""', b"")
    if b'"' in shape:  # strings with brackets: every other piece is inside one
        shape = b"".join(shape.split(b'"')[::2])  # (a string left open ends the text)
    if len(shape) <= _CHUNK and _shallow(shape, min(max_depth, _QUICK_PASSES)):
        return False
    steps = array("b", shape)
    depth = 0
    for start in range(0, len(steps), _CHUNK):
        chunk = steps[start : start + _CHUNK]
        if max(accumulate(chunk, initial=depth)) > max_depth:
            return True
        depth += sum(chunk)  # below zero is not JSON: the decoder stops there, no deeper
    return False


def _shallow(shape: bytes, passes: int) -> bool:
    """Whether the brackets are gone after `passes` removals of every innermost pair:
    then they nest at most that deep. Most JSON is shallow, and this is cheaper than
    summing each bracket."""
    for _ in range(passes):
        fewer = shape.replace(b"\x01\xff", b"")
        if not fewer:
            return True
        if len(fewer) == len(shape):
            return False  # a bracket left unmatched: not JSON from there
        shape = fewer
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
