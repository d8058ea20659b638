from __future__ import annotations

from typing import Any, Literal

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import BaseModel, ConfigDict, Field
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.approvals import decisions
from apps.approvals.api.serializers import ApprovalSerializer, DecisionSerializer
from apps.approvals.models import ApprovalRequest, ApprovalStatus
from apps.tenants.callers import ApiPrincipal
from toolhub.apidocs import openapi_examples as examples
from toolhub.web.api import BadRequest, NewestFirst, parse_body


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=1000)
    args: dict[str, Any] | None = None


def decidable_by(user: Any) -> QuerySet[ApprovalRequest]:
    if isinstance(user, ApiPrincipal):
        return ApprovalRequest.objects.none()  # agents never decide
    return ApprovalRequest.objects.decidable_by(user)


class ApprovalListView(APIView):
    pagination_class = NewestFirst  # read by the schema (toolhub/apidocs/openapi.py); get() pages

    @extend_schema(
        operation_id="approvals_list",
        summary="Approval requests the caller may decide",
        parameters=[OpenApiParameter("status", str, enum=ApprovalStatus.values)],
        responses=ApprovalSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        approvals = decidable_by(request.user)
        wanted = request.query_params.get("status")
        if wanted is not None:
            if wanted not in ApprovalStatus.values:
                raise BadRequest(
                    "Unknown status.",
                    [
                        {
                            "field": "status",
                            "message": f"use one of {', '.join(ApprovalStatus.values)}",
                        }
                    ],
                )
            approvals = approvals.filter(status=wanted)
        paginator = NewestFirst()
        page = paginator.paginate_queryset(approvals, request, view=self)
        return paginator.get_paginated_response(ApprovalSerializer(page, many=True).data)


class ApprovalDetailView(APIView):
    @extend_schema(
        operation_id="approvals_retrieve",
        responses={
            200: ApprovalSerializer,
            410: OpenApiResponse(
                description="Pruned by retention: `detail`, `prunedAt` and `prunedBefore`"
            ),
        },
    )
    def get(self, request: Request, approval_id: str) -> Response:
        approval = decidable_by(request.user).filter(pk=approval_id).first()
        if approval is None:
            from apps.retention import gone

            body = gone.approval(approval_id, request.user)
            if body is not None:
                return Response(body, status=status.HTTP_410_GONE)
            raise NotFound("No such approval request that you may decide.")
        return Response(ApprovalSerializer(approval).data)


class DecisionView(APIView):
    @extend_schema(
        operation_id="approvals_decide",
        summary="Approve, approve with edited args, or reject",
        request=DecisionSerializer,
        responses={
            200: ApprovalSerializer,
            400: OpenApiResponse(description="Edited args invalid or refused by policy"),
            403: OpenApiResponse(description="Not allowed to decide (decide_approval, four-eyes)"),
            409: OpenApiResponse(description="Already decided, expired or cancelled"),
        },
        examples=examples.DECISION,
    )
    def post(self, request: Request, approval_id: str) -> Response:
        body = parse_body(request, DecisionBody)
        user = request.user
        if not isinstance(user, User) or not user.is_staff:
            return Response(
                {"detail": "Only staff operators decide approvals."},
                status=status.HTTP_403_FORBIDDEN,
            )
        try:
            approval = decisions.decide(approval_id, user, body.decision, body.reason, body.args)
        except decisions.DecisionError as exc:
            return Response({"detail": str(exc)}, status=exc.status_code)
        # As committed: the decision read the tool, set the decider and counted the votes.
        return Response(ApprovalSerializer(approval).data)
