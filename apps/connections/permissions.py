"""Object permission `use_connection` (django-guardian), per connection or global."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from apps.connections import grants
from apps.connections.models import Connection
from apps.tenants import object_permissions
from apps.tenants.models import Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

USE = "connections.use_connection"


def can_use_connection(user: User, connection: Connection | uuid.UUID) -> bool:
    """`user.has_perm(USE) or user.has_perm(USE, connection)`, in one query and cached
    under the authorization epoch (apps/tenants/object_permissions.py): the runner asks it
    on every call with a connection (issue 13), knowing only the connection's pk."""
    if not isinstance(connection, Connection):
        connection = Connection(pk=connection)  # only its pk is read
    return object_permissions.holds(user, USE, connection)


def usable_connections(
    tenant: Tenant, principal: str, user: User, run_id: str = ""
) -> list[Connection]:
    """The connections a call by this caller could use now: granted to it (or to the run)
    and permitted by `use_connection`, the runner's step 4 asked without a request."""
    granted = grants.usable_until(tenant, principal, run_id)
    if not granted:
        return []
    candidates = Connection.objects.filter(tenant=tenant, pk__in=list(granted)).order_by(
        "name", "pk"
    )
    return [c for c in candidates if can_use_connection(user, c)]
