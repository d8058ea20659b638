"""Shared API plumbing: error bodies, the caller of a request, pydantic at the edge."""

from __future__ import annotations

import binascii
from base64 import b64decode
from datetime import UTC
from typing import Any
from urllib.parse import parse_qs

from django.http import HttpRequest, JsonResponse
from django.utils.dateparse import parse_datetime
from pydantic import BaseModel, ValidationError
from rest_framework import exceptions, status
from rest_framework.pagination import Cursor, CursorPagination
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


class NewestFirst(CursorPagination):
    """Cursor pages by `created_at`, newest first.

    The cursor and the page size come from the client, so a forged or garbled one
    is a 400 saying so: DRF answers some with a 404 and passes a cursor's position
    to the database unchecked, where anything but a date is a 500.
    """

    ordering = "-created_at"
    page_size = 50
    max_page_size = 200
    page_size_query_param: str | None = None
    INVALID_CURSOR = [{"field": "cursor", "message": "use a next or previous link as it is"}]

    def get_page_size(self, request: Request) -> int:
        name = self.page_size_query_param
        if name is None or name not in request.query_params:
            return self.page_size
        raw = request.query_params[name]
        if not raw.isdigit() or len(raw) > 3 or not 1 <= int(raw) <= self.max_page_size:
            raise BadRequest(
                "Invalid page size.",
                [{"field": name, "message": f"an integer from 1 to {self.max_page_size}"}],
            )
        return int(raw)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The page as the API sends it (OpenAPI 3.1 types; all three keys always present)."""
        link = {"type": ["string", "null"], "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {
                "next": {
                    **link,
                    "description": "The next (older) page; null on the last.",
                    "example": "https://toolhub.example.com/api/v1/invocations/?cursor=cD0yMDI2",
                },
                "previous": {
                    **link,
                    "description": "The previous (newer) page; null on the first.",
                    "example": None,
                },
                "results": schema,
            },
        }

    def decode_cursor(self, request: Request) -> Cursor | None:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        cursor = _decode(encoded, self.offset_cutoff)
        if cursor is None:
            raise BadRequest("Invalid cursor.", self.INVALID_CURSOR)
        return cursor


def _decode(encoded: str, max_offset: int) -> Cursor | None:
    """The cursor DRF's `encode_cursor` made, or None for anything it could not have made."""
    if len(encoded) > 200:
        return None
    try:
        tokens = parse_qs(b64decode(encoded.encode("ascii"), validate=True).decode("ascii"))
    except (ValueError, binascii.Error):
        return None
    if not tokens or set(tokens) - {"o", "r", "p"} or any(len(v) != 1 for v in tokens.values()):
        return None
    offset, reverse = tokens.get("o", ["0"])[0], tokens.get("r", ["0"])[0]
    position = tokens.get("p", [None])[0]
    if not offset.isdigit() or int(offset) > max_offset or reverse not in ("0", "1"):
        return None
    if position is not None and not _is_aware_datetime(position):
        return None
    # DRF positions are strings (str() of the ordering field); the stubs say int.
    return Cursor(offset=int(offset), reverse=reverse == "1", position=position)  # type: ignore[arg-type]


def _is_aware_datetime(text: str) -> bool:
    try:
        moment = parse_datetime(text)
        return moment is not None and moment.tzinfo is not None and bool(moment.astimezone(UTC))
    except (ValueError, OverflowError):
        return False


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
