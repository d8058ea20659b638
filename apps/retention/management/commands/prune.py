from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.retention import pruning
from apps.retention.export import Exporter
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Delete finished calls (records, run events, approvals) older than their tenant's "
        "retention, in small transactions, with expired stream tickets and old task "
        "results; optionally export them first as JSON Lines (docs/deployment.md, Retention)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="only this tenant (its slug)")
        parser.add_argument(
            "--export",
            metavar="PATH",
            help="write what is pruned to PATH ('-': standard output) before deleting it",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument(
            "--batch",
            type=int,
            default=pruning.BATCH,
            help=f"records per transaction (default {pruning.BATCH})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1.")
        tenants = None
        if options["tenant"]:
            tenants = list(Tenant.objects.filter(slug=options["tenant"]))
            if not tenants:
                raise CommandError(f"No tenant {options['tenant']!r}.")
        # Progress goes to stderr when the export is standard output.
        out = self.stderr if options["export"] == "-" else self.stdout
        exporter = None
        try:
            if options["export"] and not options["dry_run"]:
                exporter = Exporter(options["export"])
            totals = pruning.prune(
                tenants,
                exporter=exporter,
                dry_run=options["dry_run"],
                batch=options["batch"],
                report=out.write,
            )
        except pruning.RetentionError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if exporter is not None:
                exporter.close()
        out.write(("would delete " if options["dry_run"] else "deleted ") + str(totals))
