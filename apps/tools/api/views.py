from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.policies.policy import catalog
from apps.tools.wire import anthropic_tool, openai_tool, tool_spec
from toolhub.api import BadRequest, CallerView

FORMATS = {"": None, "toolhub": None, "openai": openai_tool, "anthropic": anthropic_tool}


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
            )
        ],
        responses=inline_serializer(
            "ToolCatalog",
            {
                "tools": serializers.ListField(child=serializers.DictField()),
                "notice": serializers.CharField(required=False),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        wire_format = request.query_params.get("format", "")
        if wire_format not in FORMATS:
            raise BadRequest(
                "Unknown format.",
                [{"field": "format", "message": "use toolhub, openai or anthropic"}],
            )
        caller = self.caller(request)
        allowed = catalog(caller.tenant, caller.principal, caller.user)
        encode = FORMATS[wire_format]
        tools = [encode(tool) if encode else tool_spec(tool, d) for tool, d in allowed]
        body: dict[str, object] = {"tools": tools}
        if not tools:
            # Never a silent empty list: say why, so nobody runs a model tool-less by accident.
            body["notice"] = (
                f"No tool is available to {caller.principal} in tenant {caller.tenant.slug}: "
                "no enabled policy allows an enabled tool that this principal may execute "
                "(execute_tool permission)."
            )
        return Response(body)
