"""Announcing held calls where teams are: Slack, Microsoft Teams, or any receiver that
verifies a signed JSON body.

A tenant has any number of webhooks (`ApprovalWebhook`), each limited to some policy
rules or taking every held call. A new held call makes one `WebhookDelivery` per matching
webhook (unique per call and webhook, so a notification task run twice sends once) and
tries it at once, from the task queue. A failure that may pass (no answer in time, a
5xx, 408, 429, a broken answer) is tried again later (`BACKOFF`, then `failed`); one that
will not (the address guard refused the host, another 4xx, a redirect, which webhooks do
not follow) fails at once. A webhook deleted or disabled meanwhile, or a call decided
before its turn came, drops the delivery: nobody needs to hear about it any more.

Every message links the call's page in the console. With a secret, every message carries
`X-Toolhub-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">` (Slack and Teams
ignore it; a generic receiver checks it and refuses old timestamps).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from apps.connections.netguard import Blocked, BrokenResponse, NetworkPolicy, fetch
from apps.invocations.links import POLICY_LABEL

if TYPE_CHECKING:
    from apps.approvals.models import ApprovalRequest, ApprovalWebhook, WebhookDelivery

logger = logging.getLogger(__name__)

TIMEOUT_S = 5.0
# Waits before the 2nd, 3rd, ... attempt; one attempt more than waits.
BACKOFF = (timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=10))
MAX_ATTEMPTS = len(BACKOFF) + 1
# Answers worth another try; any other status >= 300 will not change by waiting.
RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", as sent in X-Toolhub-Signature."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def console_url(approval: ApprovalRequest) -> str:
    return str(settings.TOOLHUB_PUBLIC_URL) + reverse("console:detail", args=[approval.pk])


def rule_pk(approval: ApprovalRequest) -> int | None:
    """The policy rule that held the call, from its label ("policy:3:name/rule:7")."""
    match = POLICY_LABEL.match(approval.policy_rule or "")
    return int(match["rule"]) if match and match["rule"] else None


def matching(approval: ApprovalRequest) -> list[ApprovalWebhook]:
    """The tenant's enabled webhooks that take this call: those limited to no rule, and
    those limited to the rule that held it."""
    from apps.approvals.models import ApprovalWebhook

    held_by = rule_pk(approval)
    hooks = ApprovalWebhook.objects.filter(tenant=approval.tenant_id, enabled=True)
    return [
        hook
        for hook in hooks.prefetch_related("rules")
        if not hook.rules.all() or any(rule.pk == held_by for rule in hook.rules.all())
    ]


# ---------------------------------------------------------------- messages


def _facts(approval: ApprovalRequest) -> list[tuple[str, str]]:
    return [
        ("Tool", approval.tool_id),
        ("Principal", approval.principal),
        ("Tenant", approval.tenant.slug),
        ("Effect", f"{approval.tool.effect}, {approval.tool.consequence_level} consequence"),
        ("Why it waits", approval.hold_reason),
        ("Expires", f"{approval.expires_at:%Y-%m-%d %H:%M} UTC"),
    ]


def _title(approval: ApprovalRequest) -> str:
    return f"Approval needed: {approval.tool_id} for {approval.principal}"


def generic_body(approval: ApprovalRequest) -> dict[str, Any]:
    """The generic JSON notice: it names the call; the console shows its arguments."""
    return {
        "type": "approval_required",
        "approvalId": str(approval.pk),
        "tenant": approval.tenant.slug,
        "toolId": approval.tool_id,
        "principal": approval.principal,
        "runId": approval.run_id,
        "toolCallId": approval.tool_call_id,
        "effect": approval.tool.effect,
        "consequenceLevel": approval.tool.consequence_level,
        "holdReason": approval.hold_reason,
        "expiresAt": approval.expires_at.isoformat().replace("+00:00", "Z"),
        "consoleUrl": console_url(approval),
    }


def _slack_text(value: str) -> str:
    """Slack's mrkdwn: &, < and > are control characters (links, mentions)."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(approval: ApprovalRequest) -> dict[str, Any]:
    """An incoming-webhook message: a text fallback (notifications) and blocks."""
    title = _slack_text(_title(approval))
    return {
        "text": title,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _title(approval)[:150]}},
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*{name}*\n{_slack_text(value)}"[:2000]}
                    for name, value in _facts(approval)
                ],
            },
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Review in the console"},
                        "url": console_url(approval),
                        "style": "primary",
                    }
                ],
            },
        ],
    }


def teams_body(approval: ApprovalRequest) -> dict[str, Any]:
    """A Teams workflow ("When a Teams webhook request is received") message: one
    Adaptive Card."""
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {
                "type": "TextBlock",
                "text": _title(approval),
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
            },
            {
                "type": "FactSet",
                "facts": [{"title": name, "value": value} for name, value in _facts(approval)],
            },
        ],
        "actions": [
            {
                "type": "Action.OpenUrl",
                "title": "Review in the console",
                "url": console_url(approval),
            }
        ],
    }
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


RENDER = {"generic": generic_body, "slack": slack_body, "teams": teams_body}


def render(approval: ApprovalRequest, format: str) -> bytes:
    return json.dumps(RENDER[format](approval), separators=(",", ":")).encode()


# ---------------------------------------------------------------- delivery


def announce(approval: ApprovalRequest) -> int:
    """Create and try a delivery for each matching webhook; how many got through now."""
    from apps.approvals.models import WebhookDelivery

    delivered = 0
    for hook in matching(approval):
        try:
            with transaction.atomic():
                delivery = WebhookDelivery.objects.create(
                    approval=approval,
                    tenant_id=approval.tenant_id,
                    webhook=hook,
                    url=hook.url,
                    format=hook.format,
                )
        except IntegrityError:
            continue  # this task ran before (a retried queue entry): that run owns it
        delivered += attempt(delivery, approval=approval, hook=hook)
    return delivered


def attempt(
    delivery: WebhookDelivery,
    *,
    approval: ApprovalRequest | None = None,
    hook: ApprovalWebhook | None = None,
) -> int:
    """Send one delivery once; 1 when the receiver took it. Records the outcome and
    queues the next attempt when one is due."""
    from apps.approvals.models import ApprovalStatus, DeliveryStatus

    approval = approval or delivery.approval
    hook = hook or delivery.webhook
    if hook is None or not hook.enabled:
        _end(delivery, DeliveryStatus.DROPPED, "The webhook was deleted or disabled.")
        return 0
    if delivery.attempts and approval.status != ApprovalStatus.PENDING:
        _end(delivery, DeliveryStatus.DROPPED, f"The call was {approval.status} meanwhile.")
        return 0
    delivery.attempts += 1
    retry, status, error = _send(hook, render(approval, delivery.format))
    delivery.last_status = status
    delivery.last_error = error[:300]
    if not error:
        _end(delivery, DeliveryStatus.DELIVERED, "")
        return 1
    logger.warning(
        "approval webhook %r of tenant %s failed (attempt %d): %s",
        hook.name,
        approval.tenant.slug,
        delivery.attempts,
        error,
    )
    if retry and delivery.attempts < MAX_ATTEMPTS:
        _again(delivery)
    else:
        _end(delivery, DeliveryStatus.FAILED, error)
    return 0


def _send(hook: ApprovalWebhook, body: bytes) -> tuple[bool, int | None, str]:
    """POST the body: (worth retrying, HTTP status, error or "")."""
    headers = {"Content-Type": "application/json", "User-Agent": "toolhub-webhook"}
    secret = hook.signing_secret()
    if secret:
        headers["X-Toolhub-Signature"] = signature(secret, int(time.time()), body)
    host = urlsplit(hook.url).hostname or ""
    # Private networks only where a superuser allowed them (a tenant admin sets the URL);
    # link-local and metadata addresses never.
    policy = NetworkPolicy(allowed_hosts=[host], allow_private=hook.private_network)
    try:
        response = fetch(
            policy,
            "POST",
            hook.url,
            headers=headers,
            body=body,
            timeout=TIMEOUT_S,
            follow_redirects=False,
        )
    except Blocked as exc:
        return False, None, f"Blocked: {exc}"
    except BrokenResponse as exc:
        return True, None, f"BrokenResponse: {exc}"
    except TimeoutError:
        return True, None, f"TimeoutError: no answer within {TIMEOUT_S:g} s"
    except OSError as exc:
        return True, None, f"{type(exc).__name__}: {exc}"
    if response.status < 300:
        return False, response.status, ""
    if 300 <= response.status < 400:
        where = response.headers.get("location", "")
        return False, response.status, f"Redirected to {where!r}: webhooks are not followed."
    return response.status in RETRYABLE_STATUS, response.status, f"HTTP {response.status}"


def _again(delivery: WebhookDelivery) -> None:
    from apps.approvals.models import DeliveryStatus
    from apps.approvals.tasks import deliver_webhook

    wait = BACKOFF[delivery.attempts - 1]
    delivery.status = DeliveryStatus.PENDING
    delivery.next_attempt_at = timezone.now() + wait
    delivery.save()
    when = delivery.next_attempt_at
    transaction.on_commit(lambda: deliver_webhook.using(run_after=when).enqueue(str(delivery.pk)))


def _end(delivery: WebhookDelivery, status: str, error: str) -> None:
    delivery.status = status
    if error:
        delivery.last_error = error[:300]
    delivery.next_attempt_at = None
    delivery.finished_at = timezone.now()
    delivery.save()
