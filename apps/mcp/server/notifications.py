"""`notifications/tools/list_changed`: open MCP streams hear that their catalog may have changed.

A change to what a tenant's callers may use is pushed, once committed, to a
channel-layer group: the tenant's group for its policies and rules, one group
for all tenants for what is not a tenant's own (the tool rows, execute
permissions and group memberships of users). Every server process with open MCP
streams reads those groups once, through a Feed (apps/invocations/fanout.py),
and writes the notification to its streams. The notification says only "list
again"; what a client then sees is its own catalog, so a tenant learns nothing
of another's change beyond that a change happened.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from guardian.models import GroupObjectPermission, UserObjectPermission

from apps.invocations.events import _group_send
from apps.policies.models import Policy, PolicyRule
from apps.tools.models import Tool

logger = logging.getLogger(__name__)

ALL_TENANTS = "mcp.tools.all"
NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def tenant_tools_group(tenant_id: int) -> str:
    return f"mcp.tools.{tenant_id}"


def groups_for(tenant_id: int) -> tuple[str, str]:
    """The groups an MCP stream of this tenant listens to."""
    return tenant_tools_group(tenant_id), ALL_TENANTS


def announce(group: str) -> None:
    """Push list_changed to `group` once the current transaction commits."""

    def push() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            _group_send(layer, group, {"type": "mcp.tools_changed", "event": NOTIFICATION})
        except Exception:
            # Clients still see the change on their next tools/list or tools/call.
            logger.exception("could not push tools/list_changed to %s", group)

    transaction.on_commit(push)


def _policy_changed(sender: Any, instance: Policy, **kwargs: Any) -> None:
    announce(tenant_tools_group(instance.tenant_id))


def _rule_changed(sender: Any, instance: PolicyRule, **kwargs: Any) -> None:
    policies = Policy.objects.filter(pk=instance.policy_id)
    for tenant_id in policies.values_list("tenant_id", flat=True):
        announce(tenant_tools_group(tenant_id))


def _policy_tools_changed(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
    if action.startswith("post_"):
        if isinstance(instance, Policy):
            announce(tenant_tools_group(instance.tenant_id))
        else:  # tool.policy_set changed: the policies named may belong to any tenant
            announce(ALL_TENANTS)


def _everyone_changed(sender: Any, **kwargs: Any) -> None:
    if kwargs.get("action", "post_").startswith("post_"):
        announce(ALL_TENANTS)


def connect() -> None:
    """Called once from the app config's ready()."""
    post_save.connect(_policy_changed, sender=Policy, dispatch_uid="mcp-list-changed-policy")
    post_delete.connect(_policy_changed, sender=Policy, dispatch_uid="mcp-list-changed-policy-d")
    post_save.connect(_rule_changed, sender=PolicyRule, dispatch_uid="mcp-list-changed-rule")
    post_delete.connect(_rule_changed, sender=PolicyRule, dispatch_uid="mcp-list-changed-rule-d")
    m2m_changed.connect(
        _policy_tools_changed, sender=Policy.tools.through, dispatch_uid="mcp-list-changed-pt"
    )
    user_model = get_user_model()
    for model in (Tool, UserObjectPermission, GroupObjectPermission):
        uid = f"mcp-list-changed-{model.__name__}"
        post_save.connect(_everyone_changed, sender=model, dispatch_uid=uid)
        post_delete.connect(_everyone_changed, sender=model, dispatch_uid=f"{uid}-d")
    for through in (
        user_model.groups.through,
        user_model.user_permissions.through,
        Group.permissions.through,
    ):
        m2m_changed.connect(
            _everyone_changed, sender=through, dispatch_uid=f"mcp-list-changed-{through.__name__}"
        )
