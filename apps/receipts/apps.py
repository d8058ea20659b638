from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ReceiptsConfig(AppConfig):
    name = "apps.receipts"
    label = "receipts"

    def ready(self) -> None:
        post_migrate.connect(make_first_key, sender=self)


def make_first_key(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """A migrated (or flushed) database has a signing key before its first call: no call
    pays for making one (keys.signer() still makes one if they were all deleted)."""
    from apps.receipts import keys
    from apps.receipts.models import SigningKey

    if not SigningKey.objects.using(using).exists():
        keys.create(using)
