from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from apps.receipts import keys


class Command(BaseCommand):
    help = (
        "Make a new receipt signing key; the current one signs no call that starts from now "
        "on, retires after the longest tool timeout (plus a minute) and stays published in "
        "/.well-known/jwks.json, so its receipts still verify."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        new, retiring = keys.rotate()
        for old in retiring:
            assert old.retires_at is not None
            self.stdout.write(f"Retiring {old.kid} at {keys.instant(old.retires_at)}.")
        self.stdout.write(f"Signing with {new.kid}.")
