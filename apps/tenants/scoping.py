"""What a staff member may see: the tenants they have a role in, and those tenants' people.

Superusers see everything. Everyone else sees the tenants they have a role in (a
`Membership`; which of a tenant's rows they see and change is the role's business:
`staff_tenants(user, perm)`, `apps.tenants.roles`), the
groups named "<slug>: ..." of those tenants (the convention `principals.agents_group`
follows), and the users who are members of those tenants or of those groups (their
colleagues and their agents' service users). The admin scopes every page with these, so
the rule lives in one place.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.db.models import Q, QuerySet

from apps.tenants.models import Tenant
from apps.tenants.roles import tenants_where

GROUP_SEPARATOR = ": "


def is_superuser(user: Any) -> bool:
    return bool(getattr(user, "is_active", False) and getattr(user, "is_superuser", False))


def staff_tenants(user: Any, *perms: str) -> QuerySet[Tenant]:
    """The tenants where a staff member has a role (every tenant for a superuser); with
    `perms`, only those where that role gives one of them ("policies.change_policy")."""
    if not getattr(user, "is_staff", False) and not is_superuser(user):
        return Tenant.objects.none()
    return tenants_where(user, *perms)


def tenants_allowing(user: Any, *perms: str) -> QuerySet[Tenant]:
    """The tenants where a staff member's role gives *every one* of `perms`."""
    tenants = staff_tenants(user)
    for perm in perms:
        tenants = tenants.filter(pk__in=staff_tenants(user, perm).values("pk"))
    return tenants


def tenant_group_name(tenant: Tenant, name: str) -> str:
    return f"{tenant.slug}{GROUP_SEPARATOR}{name}"


def belongs_to(group: Group, tenant: Tenant) -> bool:
    """Whether the group is one of the tenant's ("<slug>: ...")."""
    return group.name.startswith(tenant_group_name(tenant, ""))


def visible_groups(user: Any) -> QuerySet[Group]:
    """Groups named "<slug>: ..." for the staff member's tenants."""
    if is_superuser(user):
        return Group.objects.all()
    # Slugs cannot contain ": ", so a prefix names exactly one tenant.
    prefixes = Q()
    for slug in staff_tenants(user).values_list("slug", flat=True):
        prefixes |= Q(name__startswith=f"{slug}{GROUP_SEPARATOR}")
    if not prefixes:
        return Group.objects.none()
    return Group.objects.filter(prefixes)


def visible_users(user: Any) -> QuerySet[User]:
    """Members of the staff member's tenants, and members of those tenants' groups."""
    if is_superuser(user):
        return User.objects.all()
    members = User.objects.filter(tenants__in=staff_tenants(user)).values("pk")
    in_groups = User.objects.filter(groups__in=visible_groups(user)).values("pk")
    return User.objects.filter(Q(pk__in=members) | Q(pk__in=in_groups))
