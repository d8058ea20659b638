"""Telling operators about new pending calls: email, and a signed webhook per tenant.

Sent from the task queue, never inline, so a slow mail server or webhook
receiver cannot slow down or fail the agent's call.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import reverse

from apps.connections import crypto
from apps.connections.netguard import Blocked, BrokenResponse, NetworkPolicy, fetch
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
    if approval.tenant.approval_webhook_url:
        sent += _webhook(approval)
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


def webhook_payload(approval: ApprovalRequest) -> bytes:
    return json.dumps(
        {
            "type": "approval_required",
            "approvalId": str(approval.pk),
            "tenant": approval.tenant.slug,
            "toolId": approval.tool_id,
            "principal": approval.principal,
            "runId": approval.run_id,
            "toolCallId": approval.tool_call_id,
            "effect": approval.tool.effect,
            "consequenceLevel": approval.tool.consequence_level,
            "expiresAt": approval.expires_at.isoformat().replace("+00:00", "Z"),
        },
        separators=(",", ":"),
    ).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", as sent in X-Toolhub-Signature."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def _webhook(approval: ApprovalRequest) -> int:
    tenant = approval.tenant
    body = webhook_payload(approval)
    secret = (
        crypto.decrypt(tenant.approval_webhook_secret)["secret"]
        if tenant.approval_webhook_secret
        else ""
    )
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["X-Toolhub-Signature"] = signature(secret, timestamp, body)
    host = urlsplit(tenant.approval_webhook_url).hostname or ""
    # Private networks only where a superuser allowed them (a tenant admin sets the URL);
    # link-local and metadata addresses never.
    policy = NetworkPolicy(allowed_hosts=[host], allow_private=tenant.webhook_private_network)
    try:
        response = fetch(
            policy,
            "POST",
            tenant.approval_webhook_url,
            headers=headers,
            body=body,
            timeout=5,
        )
    except (Blocked, BrokenResponse, OSError) as exc:
        logger.warning("approval webhook for tenant %s failed: %s", tenant.slug, type(exc).__name__)
        return 0
    if response.status >= 300:
        logger.warning("approval webhook for tenant %s answered %s", tenant.slug, response.status)
        return 0
    return 1
