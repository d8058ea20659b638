from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.retention.models import RetentionPolicy
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Set how many days a tenant's finished calls are kept ('default': the deployment's "
        "TOOLHUB_RETENTION_DAYS). At least 1 day."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("days", help="a whole number of days (1 or more), or 'default'")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        raw = options["days"].strip()
        days: int | None = None
        if raw != "default":
            try:
                days = int(raw)
            except ValueError:
                raise CommandError(f"{raw!r} is not a number of days nor 'default'.") from None
        policy = RetentionPolicy.objects.filter(tenant=tenant).first() or RetentionPolicy(
            tenant=tenant
        )
        policy.days = days
        try:
            policy.full_clean()
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        policy.save()
        shown = f"{days} days" if days is not None else "the deployment default"
        self.stdout.write(f"{tenant.slug}: finished calls are kept for {shown}.")
