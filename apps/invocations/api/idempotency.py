"""Forgetting idempotency keys: `POST /api/v1/idempotency-keys/invalidate/`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations import ledger
from apps.tenants.callers import ApiPrincipal
from apps.tenants.roles import may
from toolhub.web.api import CallerView, parse_body


class Invalidation(BaseModel):
    """Which keys to forget: every filter given must match (at least one)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    key: str | None = Field(default=None, min_length=1, max_length=200)
    tool_id: str | None = Field(default=None, min_length=1, max_length=200)
    principal: str | None = Field(default=None, min_length=1, max_length=160)

    @model_validator(mode="after")
    def _some_filter(self) -> Invalidation:
        if not (self.key or self.tool_id or self.principal):
            raise ValueError("give a key, a toolId or a principal (or several)")
        return self


class InvalidationView(CallerView):
    @extend_schema(
        operation_id="idempotency_keys_invalidate",
        summary="Forget idempotency keys, by key, tool or principal",
        description=(
            "The keys matching every filter given stop replaying their calls: the next "
            "call with one of them runs. A call still running keeps its key until it ends "
            "(a retry meanwhile waits for it), then the key is free. An API key forgets "
            "its own principal's keys; a tenant admin may name any principal of the tenant."
        ),
        request=Invalidation,
        responses={
            200: inline_serializer(
                "Invalidated", {"invalidated": serializers.IntegerField(min_value=0)}
            ),
            400: OpenApiResponse(description="No filter, or a malformed one"),
            403: OpenApiResponse(description="Another principal's keys, without the role"),
        },
    )
    def post(self, request: Request) -> Response:
        body = parse_body(request, Invalidation)
        caller = self.caller(request)
        principal = body.principal or ""
        if not self._may_name_others(request, caller.tenant.pk):
            if principal and principal != caller.principal:
                raise exceptions.PermissionDenied("You may forget only your own principal's keys.")
            principal = caller.principal
        count = ledger.invalidate(
            caller.tenant, key=body.key or "", tool_ref=body.tool_id or "", principal=principal
        )
        return Response({"invalidated": count})

    def _may_name_others(self, request: Request, tenant_id: int) -> bool:
        """Tenant admins (and superusers): whoever may change the tenant's API keys."""
        if isinstance(request.user, ApiPrincipal):
            return False
        return may(request.user, "tenants.change_apikey", tenant_id)
