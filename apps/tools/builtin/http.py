"""core__http_request: one HTTP request through a tenant's connection.

The connection supplies the credentials and the hosts they may be sent to; the
`http` capability refuses private, loopback, link-local and metadata addresses
unless the connection allows them, on every hop.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, HttpUrl

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Idempotency,
    Redaction,
    ToolContext,
    ToolContract,
    ToolOutput,
    ToolParams,
)


class HttpRequestParams(ToolParams):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET"
    url: HttpUrl = Field(description="Absolute http(s) URL on a host the connection allows")
    headers: dict[str, str] = Field(default_factory=dict, max_length=20)
    body: str | None = Field(default=None, max_length=6000)


class HttpResult(ToolOutput):
    status: int
    content_type: str
    body: str
    truncated: bool = Field(description="True when the body was cut at 16 KB")
    url: str = Field(description="The final URL, after redirects")


SAFE_METHODS = ("GET", "HEAD")


def with_idempotency_key(method: str, headers: dict[str, str], key: str | None) -> dict[str, str]:
    """The call's idempotency key as an `Idempotency-Key` header (IETF draft
    httpapi-idempotency-key-header), so the upstream can deduplicate the runner's retries
    and the caller's: every attempt of one key sends the same value. Not on GET and HEAD
    (safe by definition), and never over a header the arguments set themselves."""
    if key is None or method in SAFE_METHODS:
        return headers
    if any(name.lower() == "idempotency-key" for name in headers):
        return headers
    return {**headers, "Idempotency-Key": key}


def http_request(params: HttpRequestParams, ctx: ToolContext, caps: Capabilities) -> HttpResult:
    # The capability checks again before each hop and cuts a request out when cancelled.
    ctx.check_cancelled()
    response = caps.require("http").request(
        params.method,
        str(params.url),
        with_idempotency_key(params.method, params.headers, ctx.idempotency_id),
        params.body,
        timeout=max(1.0, min(10.0, ctx.time_left())),
    )
    return HttpResult(**response)


CONTRACTS = [
    ToolContract(
        name="http_request",
        description="Send an HTTP request through a connection (its credentials and hosts).",
        params=HttpRequestParams,
        result=HttpResult,
        execute=http_request,
        effect="external_side_effect",
        consequence_level="medium",
        requires_connection=True,
        capabilities=("http",),
        redaction=Redaction(
            result=("status", "content_type", "body", "truncated", "url"),
            args=("method", "url", "headers", "body"),
        ),
        tags=("http", "network"),
        timeout_s=15,
        # The caller's key, not the external effect's default (a key derived per run):
        # the same GET twice in a run is two reads (a status polled), and only the caller
        # knows when a write is a retry; its key reaches the upstream as Idempotency-Key.
        idempotency=Idempotency(strategy="custom"),
    )
]
