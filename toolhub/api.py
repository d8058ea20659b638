"""Shared API plumbing: error bodies, the caller of a request, pydantic at the edge."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from pydantic import BaseModel, ValidationError
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from apps.tenants.callers import ApiPrincipal, Caller, NoTenant


class BadRequest(exceptions.APIException):
    """A 400 that lists each wrong field, so a client can fix its request."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "bad_request"

    def __init__(self, detail: str, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(detail)
        self.errors = errors or []


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real bug: Django's 500 handler answers (JSON, no trace)
    if isinstance(exc, BadRequest):
        response.data = {"detail": str(exc.detail), "errors": exc.errors}
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"detail": str(response.data["detail"])}
    else:
        response.data = {"detail": "Invalid request.", "errors": response.data}
    return response


def parse_body[M: BaseModel](request: Request, model: type[M]) -> M:
    """Validate a JSON object body with a pydantic model; 400 with field errors otherwise."""
    data = request.data
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [
            {
                "field": ".".join(str(part) for part in error["loc"]) or "body",
                "message": error["msg"],
            }
            for error in exc.errors(include_input=False, include_url=False)
        ]
        raise BadRequest("The request is invalid.", errors) from None


class CallerView(APIView):
    """A view that acts for a tenant's principal: an API key, or a staff member."""

    def caller(self, request: Request) -> Caller:
        user = request.user
        if isinstance(user, ApiPrincipal):
            return user.caller
        try:
            return Caller.for_user(user, request.headers.get("X-Toolhub-Tenant"))  # type: ignore[arg-type]
        except NoTenant as exc:
            raise exceptions.PermissionDenied(str(exc)) from None


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse({"detail": "Not found."}, status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"detail": "Internal server error; it was logged."}, status=500)
