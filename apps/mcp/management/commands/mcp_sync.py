from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.mcp.discovery import SyncFailed, sync_server
from apps.mcp.models import McpServer


class Command(BaseCommand):
    help = "Discover the tools of one or every enabled MCP server. Nothing is enabled by itself."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?")
        parser.add_argument(
            "--tenant",
            help="list an HTTP server's tools with this tenant's credential (needs a name; "
            "by default the server's only credential, if it has exactly one)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["tenant"] is not None and not options["name"]:
            raise CommandError("--tenant needs the name of one server")
        servers = McpServer.objects.filter(enabled=True)
        if options["name"]:
            servers = servers.filter(name=options["name"])
            if not servers.exists():
                raise CommandError(f"no enabled MCP server named {options['name']!r}")
        failed = []
        for server in servers:
            try:
                sync_server(server, progress=self.stdout.write, tenant=options["tenant"])
            except SyncFailed as exc:
                self.stderr.write(f"{server.name}: {exc}")
                failed.append(server.name)
        if failed:
            raise CommandError(f"sync failed for {', '.join(failed)}")
