"""W3C trace context on MCP calls: the `traceparent` a caller sends is kept on its record.

MCP (SEP-414, 2026-07-28 and earlier revisions alike) carries it in a request's
`params._meta.traceparent`; HTTP callers may send the W3C `traceparent` header
instead. The `_meta` value wins when both are valid. A malformed value is ignored,
never an error: tracing is the caller's aid and must not fail a call.
"""

from __future__ import annotations

import re
from typing import Any

from apps.invocations.models import InvocationRecord

# version-traceid-parentid-flags, lowercase hex (W3C Trace Context, level 1). A later
# version may append fields after a dash; the first 55 characters are then what we keep.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
LENGTH = 55


def valid(value: Any) -> str | None:
    """The traceparent to keep from `value`, or None when it is not a valid one."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, _ = match.groups()
    if version == "ff" or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    if len(value) > LENGTH and (version == "00" or value[LENGTH] != "-"):
        return None  # version 00 is exactly 55 characters; later ones continue with "-"
    return value[:LENGTH]


def chosen(meta: Any, header: str | None) -> str | None:
    """`_meta.traceparent` when valid, else the header's when valid."""
    from_meta = valid(meta.get("traceparent")) if isinstance(meta, dict) else None
    return from_meta or valid(header)


def record(invocation: InvocationRecord, traceparent: str | None) -> None:
    """Keep the trace context on the record (a replayed record keeps its first one)."""
    if traceparent and not invocation.traceparent:
        InvocationRecord.objects.filter(pk=invocation.pk, traceparent="").update(
            traceparent=traceparent
        )
        invocation.traceparent = traceparent
