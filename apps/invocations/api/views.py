from __future__ import annotations

import math
from typing import NoReturn

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations import cancellation, runner
from apps.invocations.api.serializers import InvocationSerializer
from apps.invocations.models import InvocationRecord, Status
from apps.invocations.requests import InvocationRequest
from apps.tenants.callers import Caller
from toolhub.apidocs import openapi_examples as examples
from toolhub.web import api
from toolhub.web.api import BadRequest, CallerView, parse_body


class NewestFirst(api.NewestFirst):
    page_size_query_param = "pageSize"


def _records_of(caller: Caller) -> QuerySet[InvocationRecord]:
    return InvocationRecord.objects.filter(tenant=caller.tenant)


PRUNED = OpenApiResponse(
    description="Pruned by retention: `detail`, `prunedAt` and `prunedBefore` say when and what"
)


def pruned(invocation_id: str, caller: Caller) -> Response | None:
    """410, not 404, for a record that retention pruned (apps/retention/gone.py)."""
    from apps.retention import gone

    body = gone.record(invocation_id, caller.tenant.pk)
    return None if body is None else Response(body, status=status.HTTP_410_GONE)


def _not_found() -> NoReturn:
    raise NotFound("No such invocation in your tenant.")


UNFINISHED = (Status.RUNNING, Status.QUEUED)


def _status_of(record: InvocationRecord) -> int:
    """202 held; 409 a retry that outwaited its unfinished first attempt; else 200 (with ok)."""
    if record.status == Status.PENDING_APPROVAL:
        return status.HTTP_202_ACCEPTED
    if record.status in UNFINISHED:
        return status.HTTP_409_CONFLICT
    return status.HTTP_200_OK


class InvocationListView(CallerView):
    pagination_class = NewestFirst  # read by the schema (toolhub/apidocs/openapi.py); get() pages

    @extend_schema(
        operation_id="invocations_create",
        summary="Invoke a tool",
        request=InvocationRequest,
        responses={
            200: InvocationSerializer,
            202: OpenApiResponse(InvocationSerializer, description="Held for a human decision"),
            400: OpenApiResponse(description="Malformed request, with field errors"),
            409: OpenApiResponse(
                InvocationSerializer,
                description="A retry whose first attempt (same idempotencyKey) is still "
                "unfinished after the tool's timeout; poll the record",
            ),
        },
        examples=examples.INVOKE,
    )
    def post(self, request: Request) -> Response:
        invocation = parse_body(request, InvocationRequest)
        record = runner.invoke(self.caller(request), invocation)
        response = Response(record.as_api(), status=_status_of(record))
        if record.retry_after_ms is not None:
            response["Retry-After"] = str(math.ceil(record.retry_after_ms / 1000))
        elif record.status in UNFINISHED:
            response["Retry-After"] = "1"
        return response

    @extend_schema(
        operation_id="invocations_list",
        summary="This tenant's invocation records, newest first",
        parameters=[
            OpenApiParameter("runId", str),
            OpenApiParameter("status", str, enum=Status.values),
            OpenApiParameter("toolId", str),
        ],
        responses=InvocationSerializer(many=True),
        examples=examples.INVOCATION_PAGE,
    )
    def get(self, request: Request) -> Response:
        records = _records_of(self.caller(request))
        params = request.query_params
        if "status" in params and params["status"] not in Status.values:
            raise BadRequest(
                "Unknown status.",
                [{"field": "status", "message": f"use one of {', '.join(Status.values)}"}],
            )
        for param, field in (("runId", "run_id"), ("status", "status"), ("toolId", "tool_ref")):
            if param in params:
                records = records.filter(**{field: params[param]})
        paginator = NewestFirst()
        # The page's approvals in its own query (approvalId), not one query per record.
        page = paginator.paginate_queryset(records.select_related("approval"), request, view=self)
        return paginator.get_paginated_response(InvocationSerializer(page, many=True).data)


class InvocationDetailView(CallerView):
    @extend_schema(
        operation_id="invocations_retrieve",
        responses={200: InvocationSerializer, 410: PRUNED},
    )
    def get(self, request: Request, invocation_id: str) -> Response:
        caller = self.caller(request)
        record = _records_of(caller).filter(pk=invocation_id).first()
        if record is None:
            return pruned(invocation_id, caller) or _not_found()
        return Response(InvocationSerializer(record).data)


class InvocationCancelView(CallerView):
    @extend_schema(
        operation_id="invocations_cancel",
        summary="Cancel a held, queued or running call",
        request=None,
        responses={
            200: InvocationSerializer,
            409: OpenApiResponse(description="Already finished"),
            410: PRUNED,
        },
    )
    def post(self, request: Request, invocation_id: str) -> Response:
        caller = self.caller(request)
        record = _records_of(caller).filter(pk=invocation_id).first()
        if record is None:
            return pruned(invocation_id, caller) or _not_found()
        try:
            record = cancellation.cancel(record, by=caller.principal)
        except cancellation.NotCancellable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(InvocationSerializer(record).data)
