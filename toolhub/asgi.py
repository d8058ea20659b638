"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from toolhub.server.asgi_handler import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from toolhub.ops.health import HealthProbes  # noqa: E402
from toolhub.routing import http_router, websocket_urlpatterns  # noqa: E402
from toolhub.server.daphne_frames import install_daphne_frames  # noqa: E402
from toolhub.server.draining import (  # noqa: E402
    Draining,
    install_daphne_drain,
    refusing_streams_when_stopping,
)
from toolhub.server.limits import (  # noqa: E402
    ASGIApp,
    BodyLimitMiddleware,
    Receive,
    Scope,
    Send,
    install_daphne_body_limit,
)
from toolhub.server.startup import freeze_start_up  # noqa: E402
from toolhub.web.ws_auth import (  # noqa: E402  (needs Django set up first)
    AllowedHostsBrowserOriginValidator,
    WebSocketAuthStack,
)

# Refuse oversized bodies as they arrive, before Daphne stores them (toolhub/server/limits.py).
install_daphne_body_limit()
# Frame an event's text once for all the sockets a feed hands it to
# (toolhub/server/daphne_frames.py).
install_daphne_frames()

if settings.TOOLHUB_EMBEDDED_WORKER:
    from apps.approvals.worker import start_embedded

    start_embedded()

from apps.invocations.events import remember_server_loop  # noqa: E402


def remembering_the_loop(app: ASGIApp) -> ASGIApp:
    """Views hand their events to this loop without waiting (apps/invocations/events.py)."""

    async def remembering(scope: Scope, receive: Receive, send: Send) -> None:
        remember_server_loop()
        await app(scope, receive, send)

    return remembering


# A stopping server finishes its requests and refuses new ones (toolhub/server/draining.py).
# /healthz and /readyz are answered before Django, while draining too (toolhub/ops/health.py).
draining = Draining(
    HealthProbes(remembering_the_loop(BodyLimitMiddleware(http_router(django_asgi_app)))),
    open_while_stopping=HealthProbes.PATHS,
)
install_daphne_drain(draining)

application = ProtocolTypeRouter(
    {
        # The body limit covers /mcp/ as every other path.
        "http": draining,
        "websocket": refusing_streams_when_stopping(
            AllowedHostsBrowserOriginValidator(WebSocketAuthStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

# What import and set-up built lives as long as the server: no full collection walks it.
freeze_start_up()
