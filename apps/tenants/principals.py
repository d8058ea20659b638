"""Principals as Django users, so object permissions apply to agents too.

Each (tenant, principal) pair maps to one service user that cannot log in and
belongs to the tenant's "agents" group. Staff grant `execute_tool`,
`use_connection` and the like to that group (every agent of the tenant) or to a
single service user, with the same guardian admin they use for people.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.db.models import QuerySet
from guardian.conf import settings as guardian_settings

from apps.tenants.models import Tenant


def agents_group(tenant: Tenant) -> Group:
    group, _ = Group.objects.get_or_create(name=f"{tenant.slug}: agents")
    return group


def service_username(tenant: Tenant, principal: str) -> str:
    return f"{principal.replace(':', '+', 1)}@{tenant.slug}"[:150]


def service_user(tenant: Tenant, principal: str) -> User:
    user, created = User.objects.get_or_create(username=service_username(tenant, principal))
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        user.groups.add(agents_group(tenant))
    return user


def people() -> QuerySet[User]:
    """Users who are people: not guardian's anonymous user, not an agent's service user
    (service users are in a tenant's "agents" group). Member pickers offer these."""
    return (
        User.objects.exclude(username=guardian_settings.ANONYMOUS_USER_NAME)
        .exclude(groups__name__endswith=": agents")
        .order_by("username")
    )
