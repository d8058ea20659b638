"""Where an invocation record points: its run's timeline and events, its approval, the
policy (and rule) that decided it, and its connection, as staff URLs.

Records keep the policy as its label (`policy:<pk>:<name>` or `.../rule:<pk>`, see
`Policy.label` and `PolicyRule.label`) and the connection as its id, so that deleting a
policy or a connection never rewrites evidence; links are made when a page is shown,
and only to rows that still exist.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, urlencode

from django.core.exceptions import ObjectDoesNotExist
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.http import RFC3986_SUBDELIMS

from apps.invocations.models import InvocationRecord

POLICY_LABEL = re.compile(r"^policy:(?P<policy>\d+):.*?(?:/rule:(?P<rule>\d+))?$")


@dataclass(frozen=True)
class Link:
    text: str
    url: str


def run_timeline_url(run_id: str, tenant_slug: str) -> str:
    return _run_path(run_id) + "?" + urlencode({"tenant": tenant_slug})


_MARKER = "0run0id0"


def _run_path(run_id: str) -> str:
    """reverse("console:run", args=[run_id]), the pattern reversed once (a list page
    makes a link per row): the run id quoted as the resolver quotes it (its `str`
    converter takes anything but "/" and ""; those go through reverse, which refuses)."""
    if not run_id or "/" in run_id or not isinstance(run_id, str):
        return reverse("console:run", args=[run_id])
    before, after = _reversed_run(get_script_prefix(), get_urlconf())
    return before + quote(run_id, safe=RFC3986_SUBDELIMS + "/~:@") + after


@lru_cache(maxsize=8)
def _reversed_run(prefix: str, urlconf: str | None) -> tuple[str, str]:
    before, after = reverse("console:run", args=[_MARKER]).split(_MARKER)
    return before, after


def run_events_url(run_id: str, tenant_id: int) -> str:
    query = urlencode({"run_id": run_id, "tenant__id__exact": tenant_id})
    return reverse("admin:invocations_runevent_changelist") + "?" + query


def policy_links(label: str) -> list[Link]:
    """The policy and rule named by a record's or an approval's `policy_rule`, if they exist."""
    from apps.policies.models import Policy

    match = POLICY_LABEL.match(label or "")
    if match is None:
        return []
    policy = Policy.objects.filter(pk=int(match["policy"])).first()
    if policy is None:
        return []
    # Rules are edited inline on their policy's page.
    text = f"policy {policy.name}" + (f", rule {match['rule']}" if match["rule"] else "")
    return [Link(text, reverse("admin:policies_policy_change", args=[policy.pk]))]


def connection_link(connection_id: str) -> Link | None:
    from apps.connections.models import Connection

    if not connection_id:
        return None
    connection = (
        Connection.objects.filter(pk=connection_id).first() if _is_uuid(connection_id) else None
    )
    if connection is None:
        return None
    return Link(
        f"connection {connection.name}",
        reverse("admin:connections_connection_change", args=[connection.pk]),
    )


def record_links(record: InvocationRecord) -> list[Link]:
    """Everything a record points to, in the order an investigation follows them."""
    links = [
        Link("run timeline", run_timeline_url(record.run_id, record.tenant.slug)),
        Link("run events", run_events_url(record.run_id, record.tenant_id)),
    ]
    try:
        approval = record.approval
    except ObjectDoesNotExist:
        approval = None
    if approval is not None:
        links.append(
            Link("approval", reverse("admin:approvals_approvalrequest_change", args=[approval.pk]))
        )
        links.append(Link("approval in the console", reverse("console:detail", args=[approval.pk])))
    links += policy_links(record.policy_rule)
    connection = connection_link(record.connection_id)
    if connection is not None:
        links.append(connection)
    return links


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
