from typing import Any

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "apps.approvals"
    label = "approvals"

    def ready(self) -> None:
        # The runner announces a held call; notifying operators is this app's business
        # (the runner imports nothing from approvals but its model).
        from apps.invocations.signals import call_held, call_lapsed

        call_held.connect(_notify_pending, dispatch_uid="approvals-notify-pending")
        call_lapsed.connect(_reoffer, dispatch_uid="approvals-reoffer")


def _notify_pending(sender: Any, approval: Any, **kwargs: Any) -> None:
    from apps.approvals import notify

    notify.pending(approval)


def _reoffer(sender: Any, record: Any, **kwargs: Any) -> bool:
    from apps.approvals import tasks

    return tasks.reoffer(record)
