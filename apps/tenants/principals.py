"""Principals as Django users, so object permissions apply to agents too.

Each (tenant, principal) pair maps to its own service user, never shared, that cannot
log in and belongs to the tenant's "agents" group. Staff grant `execute_tool`,
`use_connection` and the like to that group (every agent of the tenant) or to a
single service user, with the same guardian admin they use for people.

The username is `<kind>+<name>@<slug>` (no two pairs give the same one: a slug has no
"@", a kind no "+"). When that exceeds Django's 150 characters it is
`_h+<sha256 of slug and principal>@<slug>` instead: a kind cannot start with "_", so the
two forms never meet. (Names used to be cut at 150 characters, which dropped the slug and
let two tenants' principals share a user: migration 0005 split them.)
"""

from __future__ import annotations

import hashlib

from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from guardian.conf import settings as guardian_settings

from apps.tenants.models import Tenant

USERNAME_MAX = 150
AGENTS_SUFFIX = ": agents"


class UnmappablePrincipal(ValidationError):
    """The principal's service username is taken by a user that is not its service user."""


def agents_group(tenant: Tenant) -> Group:
    group, _ = Group.objects.get_or_create(name=f"{tenant.slug}{AGENTS_SUFFIX}")
    return group


def service_username(tenant: Tenant, principal: str) -> str:
    return username_for(tenant.slug, principal)


def username_for(slug: str, principal: str) -> str:
    plain = f"{principal.replace(':', '+', 1)}@{slug}"
    if len(plain) <= USERNAME_MAX:
        return plain
    digest = hashlib.sha256(f"{slug}\n{principal}".encode()).hexdigest()
    return f"_h+{digest}@{slug}"


def service_user(tenant: Tenant, principal: str) -> User:
    """The pair's service user, created on first use; UnmappablePrincipal when its name is
    held by anyone else (a person, staff, another tenant's agent)."""
    user, created = User.objects.get_or_create(username=service_username(tenant, principal))
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        user.groups.add(agents_group(tenant))
    else:
        check_service_user(user, tenant, principal)
    return user


def existing_service_user(tenant: Tenant, principal: str) -> User | None:
    """The pair's service user if a key or a setup made it (never creates one)."""
    user = User.objects.filter(username=service_username(tenant, principal)).first()
    if user is not None:
        check_service_user(user, tenant, principal)
    return user


def check_service_user(user: User, tenant: Tenant, principal: str) -> None:
    other_agents = (
        user.groups.filter(name__endswith=AGENTS_SUFFIX)
        .exclude(name=f"{tenant.slug}{AGENTS_SUFFIX}")
        .exists()
    )
    if (
        user.is_staff
        or user.is_superuser
        or user.has_usable_password()
        or user.memberships.exists()
        or other_agents
    ):
        raise UnmappablePrincipal(
            f"Principal {principal!r} of tenant {tenant.slug} cannot be mapped safely: its "
            f"service username {user.username!r} belongs to a user that is not this "
            "principal's service user (a person, a staff member or another tenant's agent). "
            "Pick another principal name, or have a superuser rename that user.",
            code="unmappable_principal",
        )


def people() -> QuerySet[User]:
    """Users who are people: not guardian's anonymous user, not an agent's service user
    (service users are in a tenant's "agents" group). Member pickers offer these."""
    return (
        User.objects.exclude(username=guardian_settings.ANONYMOUS_USER_NAME)
        .exclude(groups__name__endswith=": agents")
        .order_by("username")
    )
