from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_delete, post_migrate, post_save


class ToolsConfig(AppConfig):
    name = "apps.tools"
    label = "tools"

    def ready(self) -> None:
        from apps.tools.call_settings import idempotency_defaults
        from apps.tools.registry import registry

        idempotency_defaults()  # ImproperlyConfigured names a bad TOOLHUB_IDEMPOTENCY_DEFAULTS
        # Registration errors stop start-up on purpose: a broken contract must
        # never reach the catalog.
        if not registry.all():
            registry.load_modules(settings.TOOLHUB_TOOL_MODULES)
        post_migrate.connect(sync_tools_after_migrate, sender=self)
        from apps.tools import rows
        from apps.tools.models import Tool

        # Every write of a tool's row changes the tools epoch (apps/tools/rows.py).
        post_save.connect(rows.tool_written, sender=Tool, dispatch_uid="tools-epoch-save")
        post_delete.connect(rows.tool_deleted, sender=Tool, dispatch_uid="tools-epoch-delete")


def sync_tools_after_migrate(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    from apps.tools.models import Tool
    from apps.tools.registry import registry

    Tool.objects.db_manager(using).sync_registry(registry)
