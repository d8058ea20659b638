"""One object permission, answered in one query and cached under the authorization epoch.

`user.has_perm(perm) or user.has_perm(perm, obj)` asks ModelBackend (the global
permission, direct or through a group: two queries) and django-guardian (the object
permission, direct or through a group: two more). The call path asks it on every call
(`execute_tool`, `use_connection`; issue 13), so this answers the same in one query, and
each process keeps the answer until the epoch changes: granting or revoking a permission,
a group membership or a user's flags changes it, so a revocation holds on the next call
in every process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth.models import Permission
from django.db.models import Model, Q, QuerySet

from apps.tenants.epoch import EpochCache

if TYPE_CHECKING:
    from django.contrib.auth.models import User

_ANSWERS = EpochCache("object permissions")


def holds(user: User, perm: str, obj: Model) -> bool:
    """The global permission `perm` ("app_label.codename") or the same on `obj`."""
    if not user.is_active:
        return False
    if user.is_superuser:
        return True
    return _ANSWERS.get((perm, user.pk, obj.pk), lambda: _holds(user, perm, str(obj.pk)))


def permission(perm: str) -> QuerySet[Permission]:
    app_label, codename = perm.split(".")
    return Permission.objects.filter(content_type__app_label=app_label, codename=codename)


def _holds(user: User, perm: str, object_pk: str) -> bool:
    return (
        permission(perm)
        .filter(
            Q(user=user)
            | Q(group__user=user)
            | Q(userobjectpermission__user=user, userobjectpermission__object_pk=object_pk)
            | Q(
                groupobjectpermission__group__user=user,
                groupobjectpermission__object_pk=object_pk,
            )
        )
        .exists()
    )
