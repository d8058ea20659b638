from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import QuerySet

from apps.approvals.models import ApprovalWebhook
from apps.connections import crypto
from apps.connections.models import Connection


class Command(BaseCommand):
    help = (
        "Re-encrypt every connection secret with the first key of TOOLHUB_ENCRYPTION_KEY. "
        "Run after putting a new key first; then the old keys can be removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        # One transaction: an unreadable secret anywhere leaves every secret as it was.
        with transaction.atomic():
            rotated = _rotate(Connection.objects.all(), "secret_encrypted", "Connection {pk}")
            rotated += _rotate(
                ApprovalWebhook.objects.all(), "secret", "The secret of approval webhook {pk}"
            )
        self.stdout.write(f"Re-encrypted {rotated} secret(s) with the newest key.")


def _rotate(queryset: QuerySet[Any], field: str, describe: str) -> int:
    """Re-encrypt `field` of every row that has one; `describe` names a row in errors."""
    rotated = 0
    for row in queryset.select_for_update().exclude(**{field: ""}):
        try:
            setattr(row, field, crypto.rotate(getattr(row, field)))
        except crypto.SecretUnreadable:
            who = describe.format(pk=row.pk)
            raise CommandError(
                f"{who} cannot be decrypted with any configured key; nothing was changed."
            ) from None
        row.save(update_fields=[field])
        rotated += 1
    return rotated
