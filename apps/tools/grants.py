"""Which tools a caller may execute, kept in each process under the grants epoch (issue 45).

The catalog intersects the usable tools with the caller's `execute_tool` grants. With
10,000 tools that is 10,000 of guardian's object permissions to read, and the catalog
read them again after every authorization change: a policy, a tool, a key edited. Who
holds a permission changes only when a permission, an object permission, a group, a
user or a membership is written, and every such write gives the grants epoch
(apps/tenants/epoch.py, GRANTS_ROW) a new value in its own transaction. So each
process keeps, per user, the ids of the tools granted (or "every tool", a global
permission) as of that epoch: read before the grants, so a grant revoked while they are
read is read again on the next catalog, never kept under the newer epoch. When the
epoch moved, its log (apps/tenants/epoch.py, EpochChange) names the objects whose
object permissions were written since: only their grants are read again. A write of
anything else (a group, a membership, a global permission) names none, and the user's
grants are read again whole.

The answer names tools by id whether they are usable or not: the catalog intersects it
with the usable tools' rows (apps/tools/rows.py), so a tool's own edit needs no grant
read. An answer equal to the one kept before is the same object: what the catalog keeps
by it (apps/policies/policy.py) survives an edit of someone else's grants.
"""

from __future__ import annotations

import threading
from itertools import chain
from typing import TYPE_CHECKING

from django.db import connections
from django.db.models import Q
from guardian.models import GroupObjectPermission, UserObjectPermission

from apps.tenants import epoch, object_permissions

if TYPE_CHECKING:
    from django.contrib.auth.models import User

EXECUTE = "tools.execute_tool"
EVERY = None  # the answer for a user who may execute every tool

_lock = threading.Lock()
_held: dict[int, tuple[int, frozenset[str] | None]] = {}  # user id -> (grants epoch, answer)


def executable_ids(user: User) -> frozenset[str] | None:
    """The ids of the tools `user` may execute, or EVERY (None): a superuser, or
    `execute_tool` held as a global permission, directly or through a group. An inactive
    user may execute none. (The user's flags are the caller's row, not kept here.)"""
    global _held
    if not user.is_active:
        return frozenset()
    if user.is_superuser:
        return EVERY
    at = epoch.read(epoch.GRANTS_ROW)  # before the grants: see apps/tenants/epoch.py
    with _lock:
        kept = _held.get(user.pk)
    if kept is not None and kept[0] == at:
        return kept[1]
    found = _patched(user, kept, at) if kept is not None else None
    if found is None:
        found = _read(user)
    if kept is not None and found == kept[1]:
        found = kept[1]  # the same object: what is kept by it stays valid
    with _lock:
        if len(_held) >= epoch.MAX_ENTRIES:
            _held = {}
        _held[user.pk] = (at, found)
    return found


def _patched(user: User, kept: tuple[int, frozenset[str] | None], at: int) -> frozenset[str] | None:
    """The answer kept at an older grants epoch with the objects whose grants were
    written since (the epoch's log) read again; None where the log cannot say (a group,
    a membership or a global permission written: everything is read again)."""
    objects = epoch.changes_since(epoch.GRANTS_ROW, kept[0], at)
    if objects is None:
        return None
    before = kept[1]
    if before is EVERY or not objects:
        return before  # a global permission is not an object's: it still holds
    found = _query(user, sorted(objects))
    return (before - objects) | found


def _read(user: User) -> frozenset[str] | None:
    permission = object_permissions.permission(EXECUTE)
    if permission.filter(Q(user=user) | Q(group__user=user)).exists():
        return EVERY
    return _query(user)


def _query(user: User, objects: list[str] | None = None) -> frozenset[str]:
    """The ids of the objects `user` holds execute_tool on, directly or through a group
    (of `objects` only, if given)."""
    permission = object_permissions.permission(EXECUTE)
    by_user = UserObjectPermission.objects.filter(permission__in=permission, user=user)
    # The user's groups as a semi-join on their membership rows, not a join through
    # auth_group (PostgreSQL filtered 10,000 joined rows in a nested loop: 3x the time).
    groups = user.groups.through.objects.filter(user_id=user.pk).values("group_id")
    by_group = GroupObjectPermission.objects.filter(permission__in=permission, group__in=groups)
    if objects is not None:
        by_user = by_user.filter(object_pk__in=objects)
        by_group = by_group.filter(object_pk__in=objects)
    ids = by_user.values_list("object_pk").union(by_group.values_list("object_pk"), all=True)
    # Rows as the driver gives them: 10,000 of them through the queryset's iterator cost
    # more than the query (issue 45).
    sql, params = ids.query.sql_with_params()
    with connections[ids.db].cursor() as cursor:
        cursor.execute(sql, params)
        return frozenset(chain.from_iterable(cursor.fetchall()))


def clear() -> None:
    global _held
    with _lock:
        _held = {}
