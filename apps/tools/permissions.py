"""Object permissions on tools (django-guardian).

`execute_tool`: who may run a tool (service users of principals, staff, or
their groups); granted per tool, or for every tool as a global permission.
`decide_approval`: who may approve or reject a tool's held calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth.models import Permission
from django.db.models import Exists, Q, QuerySet
from guardian.models import GroupObjectPermission, UserObjectPermission

from apps.tenants.epoch import EpochCache
from apps.tools.models import Tool, ToolQuerySet

if TYPE_CHECKING:
    from django.contrib.auth.models import User

EXECUTE = "tools.execute_tool"
DECIDE = "tools.decide_approval"


def can_execute(user: User, tool: Tool) -> bool:
    """What `user.has_perm(EXECUTE) or user.has_perm(EXECUTE, tool)` answers (ModelBackend's
    global permission, guardian's object permission, each direct or through a group), in
    one query instead of their four, and cached per process until the authorization epoch
    changes: this runs on every call (issue 13). A revocation changes the epoch, so it
    holds on the next call in every process."""
    if not user.is_active:
        return False
    if user.is_superuser:
        return True
    return _EXECUTE.get((user.pk, tool.pk), lambda: _holds_execute(user, tool))


# Answers as of the authorization epoch: granting or revoking a permission, a group
# membership or a user's flags changes it, so the next call asks again (issue 13).
_EXECUTE = EpochCache("execute_tool")


def _holds_execute(user: User, tool: Tool) -> bool:
    on_tool = str(tool.pk)
    return (
        _execute_permission()
        .filter(
            Q(user=user)
            | Q(group__user=user)
            | Q(userobjectpermission__user=user, userobjectpermission__object_pk=on_tool)
            | Q(
                groupobjectpermission__group__user=user,
                groupobjectpermission__object_pk=on_tool,
            )
        )
        .exists()
    )


def _execute_permission() -> QuerySet[Permission]:
    app_label, codename = EXECUTE.split(".")
    return Permission.objects.filter(content_type__app_label=app_label, codename=codename)


def executable_tools(user: User) -> ToolQuerySet:
    """Usable tools the user may execute, as guardian's get_objects_for_user with global
    permissions answers, but as one query with subqueries, not four queries before it
    (the catalog runs it on every request; issue 13)."""
    usable = Tool.objects.usable()
    if not user.is_active:
        return usable.none()
    if user.is_superuser:
        return usable
    permission = _execute_permission()
    held_globally = Exists(permission.filter(Q(user=user) | Q(group__user=user)))
    by_user = UserObjectPermission.objects.filter(permission__in=permission, user=user)
    by_group = GroupObjectPermission.objects.filter(permission__in=permission, group__user=user)
    return usable.filter(
        held_globally
        | Q(pk__in=by_user.values("object_pk"))
        | Q(pk__in=by_group.values("object_pk"))
    )


def can_decide(user: User, tool: Tool) -> bool:
    return (
        user.is_active and user.is_staff and (user.has_perm(DECIDE) or user.has_perm(DECIDE, tool))
    )
