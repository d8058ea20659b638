from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.tenants.models import ApiKey, Tenant


class Command(BaseCommand):
    help = (
        "Create an API key for a tenant's principal; prints the key once, alone on the last line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--principal", required=True, help="e.g. agent:support-bot")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        try:
            _key, raw = ApiKey.objects.issue(tenant, options["principal"], name=options["name"])
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(f"API key for {options['principal']} in {tenant.slug} (shown once):")
        self.stdout.write(raw)
