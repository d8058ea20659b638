from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.mcp.discovery import SyncFailed, sync_server
from apps.mcp.models import McpServer


class Command(BaseCommand):
    help = "Discover the tools of one or every enabled MCP server. Nothing is enabled by itself."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?")

    def handle(self, *args: Any, **options: Any) -> None:
        servers = McpServer.objects.filter(enabled=True)
        if options["name"]:
            servers = servers.filter(name=options["name"])
            if not servers.exists():
                raise CommandError(f"no enabled MCP server named {options['name']!r}")
        failed = []
        for server in servers:
            try:
                sync_server(server, progress=self.stdout.write)
            except SyncFailed as exc:
                self.stderr.write(f"{server.name}: {exc}")
                failed.append(server.name)
        if failed:
            raise CommandError(f"sync failed for {', '.join(failed)}")
