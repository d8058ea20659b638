"""Staff roles of a tenant: what an operator and a tenant admin may do.

Django model permissions are global, so a role is a set of permissions *and* tenant
membership: the admin and the approvals API show a staff member only their tenants' rows
(`apps.tenants.scoping`). Roles therefore belong to a user, not to a (user, tenant) pair.

- operator: staff, member of the tenant, may decide held calls (global `decide_approval`,
  limited to their tenants by `ApprovalRequest.objects.decidable_by`), and may read
  the tenant's records, events, approvals and plans, and the tool catalog.
- admin: an operator who may also view, add, change and delete the tenant's policies
  (and their rules), connections, grants and API keys, and view the tenant itself.

Neither may delete records or events (audit data), nor change users, groups, tenants'
membership or the global tool catalog: those stay with superusers.
"""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.db import models
from django.db.models import Q

from apps.tenants.models import Tenant


class Role(models.TextChoices):
    OPERATOR = "operator"
    ADMIN = "admin"


OPERATOR_PERMISSIONS = (
    "tools.decide_approval",
    "tools.view_tool",
    "approvals.view_approvalrequest",
    "invocations.view_invocationrecord",
    "invocations.view_runevent",
    "planning.view_plan",
)
ADMIN_MODELS = (
    "policies.policy",
    "policies.policyrule",
    "connections.connection",
    "connections.grant",
    "tenants.apikey",
)
ADMIN_PERMISSIONS = (
    *OPERATOR_PERMISSIONS,
    "tenants.view_tenant",
    *(
        f"{label.split('.')[0]}.{action}_{label.split('.')[1]}"
        for label in ADMIN_MODELS
        for action in ("view", "add", "change", "delete")
    ),
)
ROLE_PERMISSIONS = {Role.OPERATOR: OPERATOR_PERMISSIONS, Role.ADMIN: ADMIN_PERMISSIONS}


def permissions_for(role: Role) -> list[Permission]:
    names = ROLE_PERMISSIONS[role]
    query = Q()
    for name in names:
        app_label, codename = name.split(".")
        query |= Q(content_type__app_label=app_label, codename=codename)
    found = list(Permission.objects.filter(query))
    if len(found) != len(names):  # a renamed model would silently shrink a role
        missing = set(names) - {f"{p.content_type.app_label}.{p.codename}" for p in found}
        raise LookupError(f"Permissions missing for role {role}: {sorted(missing)}")
    return found


def grant_role(user: User, tenant: Tenant, role: Role) -> None:
    """Make the user staff of the tenant with the role's permissions (adds, never removes)."""
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    tenant.members.add(user)
    user.user_permissions.add(*permissions_for(role))
