"""Binding capabilities to a call (RUNTIME_BINDS_ALL): the runner's composition root.

Each provider builds one capability for one call, from the caller's tenant and
the tool context; tools receive only what their contract declares.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.mail import EmailMessage

from apps.connections import broker
from apps.planning.store import DatabasePlanStore
from apps.tenants.models import Tenant
from apps.tools.capabilities import Capabilities
from apps.tools.contracts import ToolContext


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class DjangoMailer:
    """Mail through Django's framework: console in the demo, SMTP by environment.

    A message handed to the mail server cannot be called back: a call cancelled before
    that sends nothing (ToolCancelled), one cancelled during the hand-over still sends."""

    def __init__(self, ctx: ToolContext | None = None) -> None:
        self._ctx = ctx

    def send(self, to: list[str], subject: str, body: str) -> int:
        if self._ctx is not None:
            self._ctx.check_cancelled()
        return EmailMessage(subject=subject, body=body, to=to).send()


Provider = Callable[[Tenant, ToolContext], Any]

PROVIDERS: dict[str, Provider] = {
    "clock": lambda tenant, ctx: SystemClock(),
    "plans": lambda tenant, ctx: DatabasePlanStore(tenant, ctx.run_id),
    "http": lambda tenant, ctx: broker.http_client(tenant, ctx.connection_id, cancel=ctx),
    "mail": lambda tenant, ctx: DjangoMailer(ctx),
}


def bind(names: tuple[str, ...], tenant: Tenant, ctx: ToolContext) -> Capabilities:
    return Capabilities(**{name: PROVIDERS[name](tenant, ctx) for name in names})
