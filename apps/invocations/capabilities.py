"""Binding capabilities to a call (RUNTIME_BINDS_ALL): the runner's composition root.

Each provider builds one capability for one call, from the caller's tenant and
the tool context; tools receive only what their contract declares.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from apps.planning.store import DatabasePlanStore
from apps.tenants.models import Tenant
from apps.tools.capabilities import Capabilities
from apps.tools.contracts import ToolContext


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


Provider = Callable[[Tenant, ToolContext], Any]

PROVIDERS: dict[str, Provider] = {
    "clock": lambda tenant, ctx: SystemClock(),
    "plans": lambda tenant, ctx: DatabasePlanStore(tenant, ctx.run_id),
}


def bind(names: tuple[str, ...], tenant: Tenant, ctx: ToolContext) -> Capabilities:
    return Capabilities(**{name: PROVIDERS[name](tenant, ctx) for name in names})
