"""manage.py verify_audit [--tenant SLUG] [--since ISO]: walk the audit chains."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from apps.audit import verify
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Verify each tenant's audit chain: every link recomputed and every entry's row "
        "compared; the first broken link is named. Exits 1 if a chain is broken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="Only this tenant (its slug).")
        parser.add_argument(
            "--since",
            help="Start at the first entry journaled at or after this ISO 8601 instant "
            "(e.g. 2026-11-01T00:00:00Z); its link is taken as given.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since = None
        if options["since"]:
            since = parse_datetime(options["since"])
            if since is None or since.tzinfo is None:
                raise CommandError(
                    f"--since {options['since']!r} is not an ISO 8601 instant with a time "
                    "zone (e.g. 2026-11-01T00:00:00Z)."
                )
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"No tenant {options['tenant']!r}.")
        broken = []
        for tenant in tenants.iterator():
            walk = verify.verify_tenant(tenant, since)
            if since is None:
                verify.remember(walk)
            for note in walk.notes:
                self.stdout.write(f"{tenant.slug}: {note}")
            waiting = f"; {walk.pending} not linked yet" if walk.pending else ""
            if walk.broken is not None:
                broken.append(tenant.slug)
                self.stdout.write(
                    f"{tenant.slug}: BROKEN at {walk.broken} "
                    f"({walk.checked} entries verified before it{waiting})"
                )
            elif walk.checked:
                self.stdout.write(
                    f"{tenant.slug}: OK, {walk.checked} entries #{walk.first_n}..#{walk.last_n}"
                    f"{waiting}"
                )
            else:
                self.stdout.write(f"{tenant.slug}: OK, no entries{waiting}")
        if broken:
            raise CommandError(
                f"The audit chain is broken in {len(broken)} tenant(s): {', '.join(broken)}.",
                returncode=1,
            )
