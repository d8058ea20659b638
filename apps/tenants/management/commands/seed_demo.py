from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from guardian.shortcuts import assign_perm

from apps.policies.models import Policy
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import agents_group
from apps.tenants.roles import Role, grant_role
from apps.tools.models import Effect, Source, Tool

DEMO_PRINCIPAL = "agent:demo"
EXAMPLE_CALL = '{"toolId": "core__get_current_time", "args": {"timezone": "Europe/Paris"}}'


class Command(BaseCommand):
    help = "Create the embedded demo's tenant, staff users, policy and API key (when missing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--key-file", default="", help="where the demo key's plaintext is kept")
        parser.add_argument("--port", type=int, default=int(os.environ.get("TOOLHUB_PORT", "8000")))

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo tenant"})
        admin = self._user("admin", superuser=True)
        operator = self._user("operator", superuser=False)
        tenant.members.add(admin)
        grant_role(operator, tenant, Role.OPERATOR)
        policy, _ = Policy.objects.get_or_create(
            tenant=tenant,
            name="demo: built-in tools",
            defaults={
                "description": "Every built-in tool; external side effects wait for a human.",
                "approval_effects": [Effect.EXTERNAL_SIDE_EFFECT],
            },
        )
        core_tools = list(Tool.objects.filter(source=Source.CORE, available=True))
        policy.tools.add(*core_tools)
        agents = agents_group(tenant)
        for tool in core_tools:
            assign_perm("tools.execute_tool", agents, tool)
        self._time_server(policy, agents)
        key = self._demo_key(tenant, Path(options["key_file"]) if options["key_file"] else None)
        base = f"http://127.0.0.1:{options['port']}"
        self.stdout.write(
            "\n".join(
                [
                    "",
                    "toolhub demo",
                    f"  home:      {base}/",
                    f"  admin:     {base}/admin/   (admin / admin, operator / operator)",
                    f"  console:   {base}/console/   (approvals: operator or admin)",
                    f"  demo chat: {base}/demo/chat/",
                    f"  API docs:  {base}/api/docs/",
                    f"  health:    {base}/healthz  {base}/readyz",
                    f"  demo API key for {DEMO_PRINCIPAL} in tenant demo:",
                    f"    {key}",
                    "  try:",
                    f"    curl -H 'Authorization: Bearer {key}' {base}/api/v1/tools/",
                    f"    curl -H 'Authorization: Bearer {key}' \\",
                    "         -H 'Content-Type: application/json' \\",
                    f"         -d '{EXAMPLE_CALL}' \\",
                    f"         {base}/api/v1/invocations/",
                    "",
                ]
            )
        )

    def _time_server(self, policy: Policy, agents: Any) -> None:
        """The reference MCP time server (stdio), imported and enabled for the demo, so an
        imported, governed tool stands next to the built-ins. Its effect is set to read_only
        here, as an admin would after reading it (imports start as external_side_effect)."""
        from apps.mcp.discovery import SyncFailed, apply_to_catalog, sync_server
        from apps.mcp.models import CommandNotAllowed, McpServer, McpTool, allowed_argv

        try:
            allowed_argv("mcp-server-time")
        except CommandNotAllowed:
            self.stdout.write("MCP time server skipped: mcp-server-time is not allowlisted")
            return
        server, _ = McpServer.objects.get_or_create(
            name="time", defaults={"transport": "stdio", "command": "mcp-server-time"}
        )
        try:
            sync_server(server, progress=self.stdout.write)
        except SyncFailed as exc:
            self.stdout.write(f"MCP time server skipped: {exc}")
            return
        for row in McpTool.objects.filter(server=server, unusable_reason="").select_related("tool"):
            if row.effect != Effect.READ_ONLY and not row.has_pending_change:
                row.effect = Effect.READ_ONLY
                row.tool.enabled = True
                apply_to_catalog(row)
            policy.tools.add(row.tool)
            assign_perm("tools.execute_tool", agents, row.tool)

    def _user(self, username: str, *, superuser: bool) -> User:
        user = User.objects.filter(username=username).first()
        if user is None:
            # Fixed demo passwords: this command only ever runs for the embedded demo.
            create = User.objects.create_superuser if superuser else User.objects.create_user
            user = create(username=username, password=username, is_staff=True)
        return user

    def _demo_key(self, tenant: Tenant, key_file: Path | None) -> str:
        """Reuse the key kept in the key file while it still works; else issue a new one."""
        if key_file is not None and key_file.exists():
            raw = key_file.read_text().strip()
            if ApiKey.objects.for_raw_key(raw) is not None:
                return raw
        _, raw = ApiKey.objects.issue(tenant, DEMO_PRINCIPAL, name="demo key")
        if key_file is not None:
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(raw + "\n")
            key_file.chmod(0o600)
        return raw
