"""Signing a provider's user in: which toolhub user they are, and their roles from groups.

At every sign-in the groups claim is the whole truth about a provider user's tenants:
their memberships become exactly what the mapped groups give (the highest role where
two groups name one tenant). A group removed at the provider takes its role away at the
next sign-in; a membership a superuser added by hand to such a user lasts until then.
A user whom no group gives a role is not signed in (`NoTenant`), and loses every
membership. A group naming a tenant that does not exist gives nothing, creates nothing,
and is logged and told to the user.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from apps.identity.models import ExternalIdentity, GroupMapping
from apps.tenants.models import Membership, Role, Tenant
from apps.tenants.roles import grant_role

logger = logging.getLogger(__name__)

RANK = {Role.MEMBER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


class SignInRefused(Exception):
    """The provider's answer cannot sign anyone in; the message says why, for the page."""


@dataclass
class Outcome:
    groups: list[str]
    roles: dict[Tenant, Role] = field(default_factory=dict)
    # (group, slug) for each group that names a tenant toolhub does not have.
    missing_tenants: list[tuple[str, str]] = field(default_factory=list)


class NoTenant(Exception):
    """No group of the user gives a role in any tenant."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("no mapped group")
        self.outcome = outcome


def groups_in(claims: dict[str, Any], claim: str) -> list[str]:
    """The groups claim as a list of names (absent: no groups)."""
    value = claims.get(claim)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise SignInRefused(f"The provider's {claim!r} claim is not a list of group names.")


def roles_from_groups(groups: list[str]) -> Outcome:
    outcome = Outcome(groups=groups)
    wanted: dict[int | str, Role] = {}  # tenant pk, or a slug still to look up
    found_in: dict[str, str] = {}  # slug -> the group that named it
    for mapping in GroupMapping.objects.select_related("tenant"):
        for group in groups:
            if mapping.is_pattern:
                slug = mapping.slug_in(group)
                if slug is None:
                    continue
                key: int | str = slug
                found_in.setdefault(slug, group)
            elif mapping.group == group and mapping.tenant_id is not None:
                key = mapping.tenant_id
            else:
                continue
            role = Role(mapping.role)
            if key not in wanted or RANK[role] > RANK[wanted[key]]:
                wanted[key] = role
    slugs = [key for key in wanted if isinstance(key, str)]
    by_slug = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=slugs)}
    by_pk = {
        tenant.pk: tenant
        for tenant in Tenant.objects.filter(pk__in=[k for k in wanted if isinstance(k, int)])
    }
    for key, role in wanted.items():
        tenant = by_slug.get(key) if isinstance(key, str) else by_pk.get(key)
        if tenant is None:
            outcome.missing_tenants.append((found_in[str(key)], str(key)))
            continue
        if tenant not in outcome.roles or RANK[role] > RANK[outcome.roles[tenant]]:
            outcome.roles[tenant] = role
    return outcome


def _username(claims: dict[str, Any], issuer: str, subject: str) -> str:
    """preferred_username, email or sub; a name already taken gets a name of its own
    (the provider's account never takes over a local one)."""
    wanted = str(claims.get("preferred_username") or claims.get("email") or subject)[:150]
    if not User.objects.filter(username=wanted).exists():
        return wanted
    return "oidc-" + hashlib.sha256(f"{issuer} {subject}".encode()).hexdigest()[:32]


@transaction.atomic
def sign_in(issuer: str, claims: dict[str, Any], groups_claim: str) -> tuple[User, Outcome]:
    """The user for these (verified) claims, with memberships as their groups say. With
    no role anywhere the memberships are gone too; the caller then refuses (NoTenant)."""
    subject = str(claims.get("sub") or "")
    if not subject:
        raise SignInRefused("The provider's answer has no subject (sub).")
    outcome = roles_from_groups(groups_in(claims, groups_claim))
    for group, slug in outcome.missing_tenants:
        logger.warning(
            "OpenID sign-in of %s: group %r names tenant %r, which does not exist; ignored",
            subject,
            group,
            slug,
        )
    identity = (
        ExternalIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )
    if identity is None:
        user = User(username=_username(claims, issuer, subject))
        user.set_unusable_password()
        user.save()
        identity = ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    user = identity.user
    user.email = str(claims.get("email") or user.email)[:254]
    user.first_name = str(claims.get("given_name") or user.first_name)[:150]
    user.last_name = str(claims.get("family_name") or user.last_name)[:150]
    user.is_staff = bool(outcome.roles) or user.is_superuser
    user.save(update_fields=["email", "first_name", "last_name", "is_staff"])
    identity.groups = outcome.groups
    identity.signed_in_at = timezone.now()
    identity.save(update_fields=["groups", "signed_in_at"])
    for membership in Membership.objects.filter(user=user).exclude(tenant__in=outcome.roles):
        membership.delete()  # one by one: each delete bumps the authorization epoch
    for tenant, role in outcome.roles.items():
        if Membership.objects.filter(user=user, tenant=tenant, role=role).exists():
            continue
        grant_role(user, tenant, role)
    return user, outcome
