"""What the OpenAPI document says beyond each view's own `extend_schema`: the same for all.

- Descriptions come only from `extend_schema(description=...)` and from `DESCRIPTIONS`
  below, never from docstrings: those are written for the people who change the code
  (why it is built so), not for API clients.
- Every operation lists the errors it can really answer, with the one error shape
  (`{detail, errors?}`): 401 without credentials, 403 for a caller view whose staff
  member names no (or an ambiguous) tenant, 404 on a path with an id, 400 and 413 where
  there is a body. tests/console/test_api_conformance.py sends real requests and checks
  every answer's status and body against this document.
- Caller views (API key or staff session) take `X-Toolhub-Tenant`.
- Lists are cursor pages (`next`, `previous`, `results`): views that page declare
  `pagination_class`, which drf-spectacular reads to wrap the list and add `cursor`
  (and `pageSize`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

WEBSOCKET_DOCS = "/api/docs/websockets/"


ERROR = inline_serializer(
    "Error",
    {
        "detail": serializers.CharField(help_text="What went wrong, in a sentence."),
        "errors": inline_serializer(
            "FieldError",
            {
                "field": serializers.CharField(
                    help_text="Dotted path of the wrong field, e.g. `args.to`."
                ),
                "message": serializers.CharField(),
            },
            many=True,
            required=False,
            help_text="One entry per wrong field (400 only).",
        ),
    },
)


TENANT_HEADER = OpenApiParameter(
    "X-Toolhub-Tenant",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Staff sessions only: the slug of the tenant to act in, required when the staff "
        "member belongs to more than one (otherwise 403). Ignored for API keys, which "
        "belong to one tenant."
    ),
)


def error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ERROR, description=description)


UNAUTHENTICATED = error("No or an unknown credential (`WWW-Authenticate: Bearer`).")
NO_TENANT = error(
    "A staff session whose tenant is unclear (no tenant, or several and no "
    "`X-Toolhub-Tenant`), or a tenant it is not a member of."
)
NOT_FOUND = error("No such object in the caller's tenant (other tenants' ids look the same).")
MALFORMED = error("The request is malformed: body not a JSON object, or wrong fields.")
BAD_QUERY = error("A query parameter is invalid (unknown value, garbled cursor, page size).")
TOO_LARGE = error("The body is over TOOLHUB_MAX_REQUEST_BYTES; refused before it is read.")


class ToolhubAutoSchema(AutoSchema):
    def get_description(self) -> str:  # type: ignore[override]
        return ""  # docstrings are for maintainers; see the module docstring

    def get_override_parameters(self) -> list[Any]:
        from toolhub.web.api import CallerView

        return [TENANT_HEADER] if isinstance(self.view, CallerView) else []

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        for code, response in self._common_errors().items():
            if code not in responses:
                responses[code] = self._get_response_for_code(response, code)
        for code, response in responses.items():
            if code >= "400" and "content" not in response:  # a view's own error entry
                described = error(response.get("description", ""))
                responses[code] = self._get_response_for_code(described, code)
        return responses

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> Any:
        """Fields a serializer leaves out when empty (its `OPTIONAL`) are not required."""
        schema = super()._map_basic_serializer(serializer, direction)
        optional = set(getattr(serializer, "OPTIONAL", ()))
        if optional and "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in optional]
        return schema

    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        """A nullable JSON field is any JSON value: drf-spectacular's `oneOf [{}, null]`
        would refuse null itself (null matches both branches)."""
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if isinstance(schema, dict) and schema.get("oneOf") == [{}, {"type": "null"}]:
            schema.pop("oneOf")
        return schema

    def _common_errors(self) -> dict[str, OpenApiResponse]:
        from toolhub.web.api import CallerView

        errors: dict[str, OpenApiResponse] = {}
        if self.get_auth():
            errors["401"] = UNAUTHENTICATED
        if isinstance(self.view, CallerView):
            errors["403"] = NO_TENANT
        if "{" in self.path:
            errors["404"] = NOT_FOUND
        if any(p.get("in") == "query" for p in self._get_parameters()):
            errors["400"] = BAD_QUERY
        if self.method in ("POST", "PUT", "PATCH"):
            errors["400"] = MALFORMED
            errors["413"] = TOO_LARGE
        return errors


# Component descriptions for clients. Any other component's top-level description (a
# serializer's or a pydantic model's docstring) is dropped by `postprocess`.
DESCRIPTIONS = {
    "Invocation": (
        "One tool call as recorded. Optional fields are left out when empty; `result` only "
        "when `ok` is true; `errorCode` and `safeMessage` when it failed."
    ),
    "InvocationRequestRequest": (
        "Give `args` (an object) or `arguments` (the model's raw JSON text), not both."
    ),
    "Approval": "A call held for a human decision.",
    "DecisionRequest": "Approve (optionally with edited `args`, re-validated) or reject.",
    "Error": "Every error answer: `detail`, and `errors` per field for a 400.",
    "FieldError": "One wrong field of a 400.",
    "ToolCatalog": (
        "The tools this caller may use. `tools` holds ToolSpec objects, or the OpenAI / "
        "Anthropic tool shapes with `?format=`; `notice` says why the list is empty."
    ),
    "StreamTicket": "A single-use ticket for one run's stream, valid until `expiresAt`.",
}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> Any:
    """The API's description, and curated component descriptions only (see DESCRIPTIONS)."""
    result.setdefault("info", {})["description"] = API_DESCRIPTION
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name in DESCRIPTIONS:
            schema["description"] = DESCRIPTIONS[name]
        elif "enum" not in schema:
            schema.pop("description", None)
    return result


API_DESCRIPTION = f"""
toolhub runs LLM agents' tool calls under policy, approval and audit.

**Authentication.** Agents send an API key: `Authorization: Bearer <key>`. Staff use their
browser session (log in at `/admin/login/`); a staff member of several tenants names one
with the `X-Toolhub-Tenant: <slug>` header. No credential → `401`; a credential that may
not do this → `403`.

**Errors.** Every error body is `{{"detail": "...", "errors": [{{"field", "message"}}]}}`
(`errors` on 400 only). A tool that was refused or failed is *not* an HTTP error: the
invocation answers `200` with `ok: false`, an `errorCode` and a `safeMessage`.

**Status codes.** `200` done (success or tool-level failure), `201` created (stream
tickets), `202` held for approval, `400` malformed request, `401`, `403`, `404` (also for
other tenants' ids), `409` conflict (already decided, already finished, or an idempotent
retry still running), `413` body too large. A rate-limited call is a `200` with
`errorCode: "rate_limited"`, `retryAfterMs` and a `Retry-After` header: the REST API
answers no `429` of its own (only the admin login throttle and `/mcp/` do). During a
database outage every endpoint answers `503` with `Retry-After`.

**Lists** are cursor pages, newest first: `{{"next": url|null, "previous": url|null,
"results": [...]}}`. Follow `next` as it is; `cursor` is opaque, `pageSize` (1 to 200, where
offered) sets the page length.

**Streams.** Run events and the operators' approval feed are WebSockets:
[WebSocket protocol]({WEBSOCKET_DOCS}) (URLs, authentication, messages, close codes;
machine-readable as [AsyncAPI](/api/docs/asyncapi.yaml)).
""".strip()
