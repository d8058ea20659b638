"""Telling operators about new pending calls: email, and the tenant's webhooks
(`apps.approvals.webhooks`: Slack, Teams, signed JSON).

Sent from the task queue, never inline, so a slow mail server or webhook
receiver cannot slow down or fail the agent's call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import reverse

from apps.approvals import webhooks
from apps.tools.permissions import can_decide

if TYPE_CHECKING:
    from apps.approvals.models import ApprovalRequest

logger = logging.getLogger(__name__)


def pending(approval: ApprovalRequest) -> None:
    """Queue the notifications for a new pending request (called after commit)."""
    from apps.approvals.tasks import notify_pending

    notify_pending.enqueue(str(approval.pk))


def deciders(approval: ApprovalRequest) -> list[User]:
    """Staff who may decide this request: its tenant's staff whose role or object
    permission allows it, and superusers."""
    candidates = User.objects.filter(is_active=True, is_staff=True).filter(
        Q(tenants=approval.tenant) | Q(is_superuser=True)
    )
    return [
        user
        for user in candidates.distinct()
        if can_decide(user, approval.tool, approval.tenant_id)
    ]


def send_pending(approval: ApprovalRequest) -> int:
    """Email and webhook independently: one failing does not stop the other."""
    sent = 0
    try:
        sent += _email(approval)
    except OSError as exc:  # SMTP errors are OSErrors
        logger.warning("approval email for %s failed: %s", approval.pk, type(exc).__name__)
    sent += webhooks.announce(approval)
    return sent


def _email(approval: ApprovalRequest) -> int:
    recipients = [user.email for user in deciders(approval) if user.email]
    if not recipients:
        return 0
    link = settings.TOOLHUB_PUBLIC_URL + reverse("console:detail", args=[approval.pk])
    body = (
        f"{approval.principal} wants to run {approval.tool_id} "
        f"({approval.tool.effect}, {approval.tool.consequence_level} consequence) "
        f"in tenant {approval.tenant.slug}.\n\n"
        f"Why it waits: {approval.hold_reason}\n"
        f"Expires: {approval.expires_at:%Y-%m-%d %H:%M} UTC\n\n"
        f"Review it: {link}\n"
    )
    message = EmailMessage(
        subject=f"[toolhub] approval needed: {approval.tool_id}", body=body, bcc=recipients
    )
    return message.send()
