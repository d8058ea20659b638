from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.connections.models import Connection
from apps.policies import setup
from apps.tenants.models import Tenant
from apps.tools.models import Tool


class Command(BaseCommand):
    help = (
        "Let a tenant's principal call a tool: the policy entry, execute_tool for its "
        "service user, and use of a connection if the tool needs one (what the admin's "
        "setup page does). Idempotent. --approval makes every call wait for an operator."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--principal", required=True, help="e.g. agent:support-bot")
        parser.add_argument("--tool", required=True, help="tool id, e.g. core__http_request")
        parser.add_argument("--connection", default=None, help="connection id (UUID)")
        parser.add_argument("--approval", action="store_true", help="hold every call")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        tool = Tool.objects.filter(pk=options["tool"]).first()
        if tool is None:
            raise CommandError(f"No tool {options['tool']!r} in the catalog.")
        connection = None
        if options["connection"]:
            connection = Connection.objects.filter(tenant=tenant, pk=options["connection"]).first()
            if connection is None:
                raise CommandError(f"No connection {options['connection']} in {tenant.slug}.")
        try:
            report = setup.grant_tool(
                tenant, options["principal"], tool, connection, approval=options["approval"]
            )
        except setup.SetupError as exc:
            raise CommandError(str(exc)) from None
        for step in report.steps:
            self.stdout.write(f"{'created' if step.created else 'exists '}  {step.detail}")
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
