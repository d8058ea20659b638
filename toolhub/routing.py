"""WebSocket routes (the run and approval streams plug in here)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

websocket_urlpatterns: list[URLPattern | URLResolver] = []
