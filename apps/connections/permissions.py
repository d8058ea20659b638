"""Object permission `use_connection` (django-guardian), per connection or global."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth.models import Permission
from django.db.models import Q

from apps.connections.models import Connection, Grant
from apps.tenants.epoch import EpochCache
from apps.tenants.models import Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

USE = "connections.use_connection"


def can_use_connection(user: User, connection: Connection) -> bool:
    """What `user.has_perm(USE) or user.has_perm(USE, connection)` answers (ModelBackend's
    global permission, guardian's object permission, each direct or through a group), in
    one query instead of their four, and cached per process until the authorization epoch
    changes: the runner asks it on every call with a connection (issue 13). Granting or
    revoking it, a group membership or a user's flags changes the epoch, so a revocation
    holds on the next call in every process."""
    if not user.is_active:
        return False
    if user.is_superuser:
        return True
    return _USE.get((user.pk, connection.pk), lambda: _holds_use(user, connection))


_USE = EpochCache("use_connection")


def _holds_use(user: User, connection: Connection) -> bool:
    app_label, codename = USE.split(".")
    on_connection = str(connection.pk)
    return (
        Permission.objects.filter(content_type__app_label=app_label, codename=codename)
        .filter(
            Q(user=user)
            | Q(group__user=user)
            | Q(userobjectpermission__user=user, userobjectpermission__object_pk=on_connection)
            | Q(
                groupobjectpermission__group__user=user,
                groupobjectpermission__object_pk=on_connection,
            )
        )
        .exists()
    )


def usable_connections(
    tenant: Tenant, principal: str, user: User, run_id: str = ""
) -> list[Connection]:
    """The connections a call by this caller could use now: granted to it (or to the run)
    and permitted by `use_connection`, the runner's step 4 asked without a request."""
    granted = Grant.objects.usable_by(tenant, principal, run_id).values("connection")
    candidates = Connection.objects.filter(tenant=tenant, pk__in=granted).order_by("name", "pk")
    return [c for c in candidates if can_use_connection(user, c)]
