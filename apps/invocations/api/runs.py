from __future__ import annotations

import uuid
from typing import Annotated

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations import runs
from apps.invocations.requests import Identifier
from toolhub.apidocs import openapi_examples as examples
from toolhub.web.api import BadRequest, CallerView, parse_body

ToolId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class RunStart(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    run_id: Identifier | None = None
    tools: list[ToolId] = Field(max_length=runs.MAX_TOOLS)


RUN = inline_serializer(
    "Run",
    {
        "runId": serializers.CharField(),
        "tools": serializers.ListField(child=serializers.CharField()),
        "startedBy": serializers.CharField(),
    },
)


class RunListView(CallerView):
    @extend_schema(
        operation_id="runs_create",
        summary="Start a run limited to a tool allowlist",
        description="The run's catalog (GET /api/v1/tools/?runId=) lists only these tools "
        "and its calls outside them are refused (policy_denied). Every tool must be in the "
        "caller's catalog. The allowlist is fixed once set: the same start again answers "
        "200, another allowlist 409.",
        request=inline_serializer(
            "RunStart",
            {
                "runId": serializers.CharField(required=False),
                "tools": serializers.ListField(child=serializers.CharField()),
            },
        ),
        responses={
            201: RUN,
            200: OpenApiResponse(RUN, description="Started before with the same tools"),
            400: OpenApiResponse(description="No tools, or tools outside the caller's catalog"),
            409: OpenApiResponse(description="The run has another allowlist, or calls without"),
        },
        examples=examples.RUN_START,
    )
    def post(self, request: Request) -> Response:
        body = parse_body(request, RunStart)
        caller = self.caller(request)
        run_id = body.run_id or f"run_{uuid.uuid4().hex}"
        try:
            started = runs.start(caller, run_id, body.tools)
        except runs.RunError as exc:
            if exc.status == 400:
                raise BadRequest(
                    exc.message, [{"field": "tools", "message": exc.message}]
                ) from None
            return Response({"detail": exc.message}, status=exc.status)
        return Response(
            {"runId": started.run_id, "tools": started.tools, "startedBy": started.started_by},
            status=201 if started.created else 200,
        )
