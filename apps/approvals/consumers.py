"""The operators' stream: /ws/v1/approvals/ — approvals appearing and being decided.

Staff sessions only. The consumer listens to the streams of the tenants the
user operates and re-checks, per message, that the user may decide that tool.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.invocations.events import remember_server_loop, tenant_group
from apps.invocations.streams import CLOSE_FORBIDDEN, refuse
from apps.tenants.models import Tenant
from apps.tools.models import Tool
from apps.tools.permissions import can_decide


class ApprovalsConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        remember_server_loop()
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        self.decidable: dict[str, bool] = {}
        await self.accept()
        for tenant_id in await self._tenant_ids(user):
            group = tenant_group(tenant_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def approval_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if await self._may_decide(event["toolId"]):
            await self.send_json(event)

    @database_sync_to_async
    def _tenant_ids(self, user: Any) -> list[int]:
        tenants = Tenant.objects.all() if user.is_superuser else Tenant.objects.filter(members=user)
        return list(tenants.values_list("pk", flat=True))

    async def _may_decide(self, tool_id: str) -> bool:
        if tool_id not in self.decidable:
            self.decidable[tool_id] = await self._check(tool_id)
        return self.decidable[tool_id]

    @database_sync_to_async
    def _check(self, tool_id: str) -> bool:
        tool = Tool.objects.filter(pk=tool_id).first()
        return tool is not None and can_decide(self.scope["user"], tool)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """One-way stream; client messages are ignored."""
