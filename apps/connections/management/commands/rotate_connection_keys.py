from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.connections import crypto
from apps.connections.models import Connection
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Re-encrypt every connection secret with the first key of TOOLHUB_ENCRYPTION_KEY. "
        "Run after putting a new key first; then the old keys can be removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        rotated = 0
        with transaction.atomic():
            for connection in Connection.objects.select_for_update().exclude(secret_encrypted=""):
                try:
                    connection.secret_encrypted = crypto.rotate(connection.secret_encrypted)
                except crypto.SecretUnreadable:
                    raise CommandError(
                        f"Connection {connection.pk} cannot be decrypted with any configured key; "
                        "nothing was changed."
                    ) from None
                connection.save(update_fields=["secret_encrypted"])
                rotated += 1
            for tenant in Tenant.objects.select_for_update().exclude(approval_webhook_secret=""):
                try:
                    tenant.approval_webhook_secret = crypto.rotate(tenant.approval_webhook_secret)
                except crypto.SecretUnreadable:
                    raise CommandError(
                        f"The webhook secret of tenant {tenant.slug} cannot be decrypted with any "
                        "configured key; nothing was changed."
                    ) from None
                tenant.save(update_fields=["approval_webhook_secret"])
                rotated += 1
        self.stdout.write(f"Re-encrypted {rotated} secret(s) with the newest key.")
