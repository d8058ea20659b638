from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.request import Request

from apps.invocations import runs
from apps.invocations.streams import is_run_id
from apps.tools.listing import FORMATS, catalog_body
from toolhub.apidocs import openapi_examples as examples
from toolhub.web.api import BadRequest, CallerView

TOOL_SPEC = inline_serializer(
    "ToolSpec",
    {
        "id": serializers.CharField(),
        "name": serializers.CharField(),
        "description": serializers.CharField(),
        "inputSchema": serializers.DictField(help_text="JSON Schema of the arguments"),
        "effect": serializers.CharField(),
        "consequenceLevel": serializers.CharField(),
        "requiresConfirmation": serializers.BooleanField(),
        "requiresApproval": serializers.BooleanField(),
        "requiresConnection": serializers.BooleanField(),
        "timeoutMs": serializers.IntegerField(),
        "tags": serializers.ListField(child=serializers.CharField()),
        "dependsOn": serializers.ListField(
            child=serializers.CharField(), help_text="Ids of the tools this one calls internally"
        ),
        "version": serializers.CharField(),
        "schemaHash": serializers.CharField(),
    },
)
OPENAI_TOOL = inline_serializer(
    "OpenAITool",
    {
        "type": serializers.ChoiceField(choices=["function"]),
        "function": inline_serializer(
            "OpenAIFunction",
            {
                "name": serializers.CharField(),
                "description": serializers.CharField(),
                "parameters": serializers.DictField(),
            },
        ),
    },
)
ANTHROPIC_TOOL = inline_serializer(
    "AnthropicTool",
    {
        "name": serializers.CharField(),
        "description": serializers.CharField(),
        "input_schema": serializers.DictField(),
    },
)


@extend_schema_field(
    PolymorphicProxySerializer(
        component_name="ToolEntry",
        serializers=[TOOL_SPEC, OPENAI_TOOL, ANTHROPIC_TOOL],
        resource_type_field_name=None,
    )
)
class ToolEntryField(serializers.DictField):
    """ToolSpec by default; the OpenAI or Anthropic shape with ?format=."""


class ToolCatalogView(CallerView):
    @extend_schema(
        operation_id="tools_list",
        summary="The tool catalog this caller may use",
        parameters=[
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["toolhub", "openai", "anthropic"],
                description="Wire shape of the list (default: toolhub's ToolSpec).",
            ),
            OpenApiParameter(
                "runId",
                OpenApiTypes.STR,
                description="A run started with an allowlist (POST /api/v1/runs/): only the "
                "tools on it. A run without one lists the whole catalog.",
            ),
        ],
        responses=inline_serializer(
            "ToolCatalog",
            {
                "tools": serializers.ListField(child=ToolEntryField()),
                "notice": serializers.CharField(required=False),
            },
        ),
        examples=examples.CATALOG,
    )
    def get(self, request: Request) -> HttpResponse:
        wire_format = request.query_params.get("format", "")
        if wire_format not in FORMATS:
            raise BadRequest(
                "Unknown format.",
                [{"field": "format", "message": "use toolhub, openai or anthropic"}],
            )
        caller = self.caller(request)
        run_id = request.query_params.get("runId")
        run = None
        if run_id is not None:
            if not is_run_id(run_id):
                raise BadRequest(
                    "Invalid runId.",
                    [{"field": "runId", "message": "1-128 characters of A-Z a-z 0-9 . _ : -"}],
                )
            allowed = runs.allowlist(caller.tenant, run_id)
            run = (run_id, allowed) if allowed is not None else None
        body = catalog_body(caller.tenant, caller.principal, caller.user, wire_format, run)
        return HttpResponse(body, content_type="application/json")
