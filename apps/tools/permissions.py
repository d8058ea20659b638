"""Object permissions on tools (django-guardian).

`execute_tool`: who may run a tool (service users of principals, staff, or
their groups); granted per tool, or for every tool as a global permission.
`decide_approval`: who may approve or reject a tool's held calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Exists, Q
from guardian.models import GroupObjectPermission, UserObjectPermission

from apps.tenants import object_permissions, roles
from apps.tools.models import Tool, ToolQuerySet

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from apps.tenants.models import Tenant

EXECUTE = "tools.execute_tool"
DECIDE = "tools.decide_approval"


def can_execute(user: User, tool: Tool) -> bool:
    """`user.has_perm(EXECUTE) or user.has_perm(EXECUTE, tool)`, in one query and cached
    under the authorization epoch (apps/tenants/object_permissions.py): this runs on every
    call (issue 13)."""
    return object_permissions.holds(user, EXECUTE, tool)


def executable_tools(user: User) -> ToolQuerySet:
    """Usable tools the user may execute, as guardian's get_objects_for_user with global
    permissions answers, but as one query with subqueries, not four queries before it
    (the catalog runs it on every request; issue 13)."""
    usable = Tool.objects.usable()
    if not user.is_active:
        return usable.none()
    if user.is_superuser:
        return usable
    permission = object_permissions.permission(EXECUTE)
    held_globally = Exists(permission.filter(Q(user=user) | Q(group__user=user)))
    by_user = UserObjectPermission.objects.filter(permission__in=permission, user=user)
    by_group = GroupObjectPermission.objects.filter(permission__in=permission, group__user=user)
    return usable.filter(
        held_globally
        | Q(pk__in=by_user.values("object_pk"))
        | Q(pk__in=by_group.values("object_pk"))
    )


def can_decide(user: User, tool: Tool, tenant: Tenant | int) -> bool:
    """May this staff user decide held calls of `tool` in `tenant`: their role there gives
    decide_approval (operator, tenant admin), or they have a role there and hold
    decide_approval on the tool as an object permission (guardian)."""
    if not (user.is_active and user.is_staff):
        return False
    if user.is_superuser:
        return True
    role = roles.role_in(user, tenant)
    if role is None:
        return False
    return DECIDE in roles.ROLE_PERMISSIONS[role] or user.has_perm(DECIDE, tool)
