"""WebSocket routes, and the HTTP paths served outside Django's views (`/mcp/`)."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import URLPattern, URLResolver, path, re_path

from apps.approvals.consumers import ApprovalsConsumer
from apps.invocations.consumers import RunConsumer
from apps.invocations.streams import CLOSE_NOT_FOUND, NO_CHANNEL, refuse
from apps.mcp.server.transport import endpoint as mcp_endpoint
from toolhub.server.limits import ASGIApp, Receive, Scope, Send


class NoSuchStream(AsyncWebsocketConsumer):
    """Any other path: closed with 4404. Without a catch-all, channels' router raises
    on an unknown path, which Daphne answers with a 500 and logs as a traceback."""

    channel_layer_alias = NO_CHANNEL

    async def connect(self) -> None:
        await refuse(self, CLOSE_NOT_FOUND)


websocket_urlpatterns: list[URLPattern | URLResolver] = [
    # Any segment reaches the consumer, which closes a malformed run id with 4400.
    re_path(r"^ws/v1/runs/(?P<run_id>[^/]*)/$", RunConsumer.as_asgi()),
    path("ws/v1/approvals/", ApprovalsConsumer.as_asgi()),
    re_path(r"", NoSuchStream.as_asgi()),
]


MCP_PATHS = ("/mcp/", "/mcp")


def http_router(django_app: ASGIApp) -> ASGIApp:
    """`/mcp/` to the MCP server (its streams need the raw ASGI connection), the rest to Django."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        app = mcp_endpoint if scope.get("path") in MCP_PATHS else django_app
        await app(scope, receive, send)

    return route
