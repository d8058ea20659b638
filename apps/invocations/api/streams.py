from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from pydantic import BaseModel, ConfigDict
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations.models import StreamTicket
from apps.invocations.requests import Identifier
from toolhub.apidocs import openapi_examples as examples
from toolhub.web.api import CallerView, parse_body


class TicketRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runId: Identifier


class StreamTicketView(CallerView):
    @extend_schema(
        operation_id="stream_tickets_create",
        summary="A single-use, 60-second ticket for /ws/v1/runs/{runId}/?ticket=",
        request=inline_serializer("StreamTicketRequest", {"runId": serializers.CharField()}),
        responses={
            201: inline_serializer(
                "StreamTicket",
                {"ticket": serializers.CharField(), "expiresAt": serializers.DateTimeField()},
            )
        },
        examples=examples.STREAM_TICKET,
    )
    def post(self, request: Request) -> Response:
        body = parse_body(request, TicketRequest)
        caller = self.caller(request)
        # Issued under a staff session (no key): the stream is tied to that session.
        session = getattr(request, "session", None) if caller.api_key is None else None
        ticket, raw = StreamTicket.objects.issue(
            caller.tenant,
            caller.principal,
            caller.user.pk,
            body.runId,
            api_key=caller.api_key,
            session_key=(session.session_key if session is not None else None) or "",
        )
        return Response(
            {"ticket": raw, "expiresAt": ticket.expires_at.isoformat().replace("+00:00", "Z")},
            status=201,
        )
