from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from apps.tools.models import Tool
from apps.tools.registry import registry


class Command(BaseCommand):
    help = "Mirror the in-code tool contracts into the catalog (migrate does this too)."

    def handle(self, *args: Any, **options: Any) -> None:
        tools = Tool.objects.sync_registry(registry)
        self.stdout.write(f"Synced {len(tools)} tools: {', '.join(t.id for t in tools)}")
