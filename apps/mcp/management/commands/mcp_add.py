from __future__ import annotations

from argparse import BooleanOptionalAction
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.mcp.models import McpServer, Transport


class Command(BaseCommand):
    help = (
        "Register an MCP server: --url for streamable HTTP, or --command for a stdio program "
        "on TOOLHUB_MCP_STDIO_COMMANDS. Then run mcp_sync."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--url")
        target.add_argument("--command", dest="stdio_command")
        parser.add_argument(
            "--timeout-ms",
            type=int,
            help="Timeout of each of its tools' calls and of its listing (kept as it was "
            "when not given; new servers: 15000). Applies to the next call.",
        )
        parser.add_argument(
            "--allow-private-network",
            action=BooleanOptionalAction,
            default=None,
            help="Let toolhub reach this HTTP server on a private or loopback address "
            "(kept as it was when not given; new servers: no).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        server = McpServer.objects.filter(name=name).first() or McpServer(name=name)
        if options["url"]:
            server.transport, server.url, server.command = Transport.HTTP, options["url"], ""
        else:
            server.transport, server.url = Transport.STDIO, ""
            server.command = options["stdio_command"]
        if options["timeout_ms"] is not None:
            server.timeout_ms = options["timeout_ms"]
        if options["allow_private_network"] is not None:
            server.allow_private_network = options["allow_private_network"]
        try:
            server.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        created = server.pk is None
        server.save()
        self.stdout.write(
            f"{'Registered' if created else 'Updated'} MCP server {name}; "
            f"now run: manage.py mcp_sync {name} (with the same interpreter)"
        )
