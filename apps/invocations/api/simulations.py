"""The dry run: what `POST /api/v1/invocations/` would do with a body, nothing done."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from pydantic import Field, model_validator
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.invocations import runner
from apps.invocations.models import ErrorCode
from apps.invocations.requests import InvocationRequest
from apps.tenants.callers import ApiPrincipal, Caller, NoTenant, UnknownPrincipal, on_behalf
from toolhub.web.api import BadRequest, CallerView, parse_body


class SimulationRequest(InvocationRequest):
    """An invocation body; staff may add `principal` and `tenant` to ask as someone else."""

    principal: str | None = Field(default=None, min_length=1, max_length=160)
    tenant: str | None = Field(default=None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _both_or_neither(self) -> SimulationRequest:
        if (self.principal is None) != (self.tenant is None):
            raise ValueError("give both principal and tenant, or neither")
        return self

    def invocation(self) -> InvocationRequest:
        return InvocationRequest(**self.model_dump(exclude={"principal", "tenant"}))


def simulation_data(simulation: runner.Simulation) -> dict[str, Any]:
    """The wire shape (camelCase; absent optional fields left out)."""
    data: dict[str, Any] = {
        "decision": simulation.decision,
        "reasons": simulation.reasons,
        "checks": [
            {
                "check": v.check,
                "verdict": {True: "pass", False: "fail", None: "not_reached"}[v.ok],
                "message": v.message,
                **({"errorCode": str(v.code)} if v.code else {}),
            }
            for v in simulation.verdicts
        ],
        "argsValid": simulation.args_valid,
    }
    if simulation.refusal is not None:
        data["errorCode"] = str(simulation.refusal.code)
        data["safeMessage"] = simulation.refusal.safe_message
    if simulation.policy_rule:
        data["policyRule"] = simulation.policy_rule
    if simulation.validation_errors:
        data["validationErrors"] = simulation.validation_errors
    if simulation.connection_ok is not None:
        data["connectionOk"] = simulation.connection_ok
    return data


SimulationSchema = inline_serializer(
    "Simulation",
    {
        "decision": serializers.ChoiceField(choices=["allow", "deny", "require_approval"]),
        "errorCode": serializers.ChoiceField(choices=ErrorCode.choices, required=False),
        "safeMessage": serializers.CharField(required=False),
        "policyRule": serializers.CharField(
            required=False, help_text="The policy or rule that decided, e.g. policy:3:name/rule:7"
        ),
        "reasons": serializers.ListField(child=serializers.CharField()),
        "checks": inline_serializer(
            "SimulationCheck",
            {
                "check": serializers.CharField(),
                "verdict": serializers.ChoiceField(choices=["pass", "fail", "not_reached"]),
                "message": serializers.CharField(),
                "errorCode": serializers.ChoiceField(choices=ErrorCode.choices, required=False),
            },
            many=True,
        ),
        "argsValid": serializers.BooleanField(),
        "validationErrors": inline_serializer(
            "SimulationValidationError",
            {"field": serializers.CharField(), "message": serializers.CharField()},
            many=True,
            required=False,
        ),
        "connectionOk": serializers.BooleanField(
            required=False, help_text="Absent when the tool takes no connection"
        ),
    },
)


class SimulationView(CallerView):
    @extend_schema(
        operation_id="simulations_create",
        summary="Dry run: what an invocation would do, without running, holding or recording",
        request=SimulationRequest,
        responses={
            200: SimulationSchema,
            400: OpenApiResponse(description="Malformed request, or an unknown principal"),
            403: OpenApiResponse(description="principal/tenant sent by a non-staff caller"),
        },
    )
    def post(self, request: Request) -> Response:
        body = parse_body(request, SimulationRequest)
        simulation = runner.simulate(self._asker(request, body), body.invocation())
        return Response(simulation_data(simulation))

    def _asker(self, request: Request, body: SimulationRequest) -> Caller:
        if body.principal is None or body.tenant is None:
            return self.caller(request)
        if isinstance(request.user, ApiPrincipal):
            raise exceptions.PermissionDenied("Only staff may ask on behalf of a principal.")
        try:
            return on_behalf(request.user, body.tenant, body.principal)  # type: ignore[arg-type]
        except NoTenant as exc:
            raise exceptions.PermissionDenied(str(exc)) from None
        except UnknownPrincipal as exc:
            raise BadRequest(str(exc), [{"field": "principal", "message": str(exc)}]) from None
