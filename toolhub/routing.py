"""WebSocket routes."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from apps.approvals.consumers import ApprovalsConsumer
from apps.invocations.consumers import RunConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    re_path(r"^ws/v1/runs/(?P<run_id>[A-Za-z0-9._:\-]{1,128})/$", RunConsumer.as_asgi()),
    path("ws/v1/approvals/", ApprovalsConsumer.as_asgi()),
]
