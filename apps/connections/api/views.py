from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.connections.models import Connection
from apps.connections.permissions import usable_connections
from toolhub.web.api import CallerView

CONNECTION_REF: dict[str, serializers.Field[Any, Any, Any, Any]] = {
    "id": serializers.UUIDField(),
    "name": serializers.CharField(),
    "kind": serializers.ChoiceField(choices=Connection.Kind.values),
}


class ConnectionListView(CallerView):
    """So an agent can pick a `connectionId`: ids and names, never a secret or a host."""

    @extend_schema(
        operation_id="connections_list",
        summary="The connections this caller may use",
        parameters=[
            OpenApiParameter(
                "runId", str, description="Also list connections granted to this run only"
            )
        ],
        responses=inline_serializer(
            "ConnectionList",
            {"connections": inline_serializer("ConnectionRef", CONNECTION_REF, many=True)},
        ),
    )
    def get(self, request: Request) -> Response:
        caller = self.caller(request)
        run_id = request.query_params.get("runId", "")[:128]
        connections = usable_connections(caller.tenant, caller.principal, caller.user, run_id)
        return Response(
            {
                "connections": [
                    {"id": str(c.pk), "name": c.name, "kind": c.kind} for c in connections
                ]
            }
        )
