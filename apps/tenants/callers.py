"""Who is calling: a tenant plus a principal, from an API key or a staff session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model

from apps.tenants.epoch import EpochCache
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.principals import UnmappablePrincipal, existing_service_user
from apps.tenants.roles import tenants_where

# The role permission a dry run on behalf of a tenant's principal needs there: it shows
# what the tenant's policies, grants and keys would do, which is the tenant admin's.
ON_BEHALF_PERMISSION = "policies.view_policy"

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User


class NoTenant(Exception):
    """A staff user made an API call without a tenant they belong to."""


@dataclass(frozen=True)
class Caller:
    tenant: Tenant
    principal: str
    user: User
    api_key: ApiKey | None = None

    @classmethod
    def for_api_key(cls, key: ApiKey) -> Caller:
        return cls(tenant=key.tenant, principal=key.principal, user=key.user, api_key=key)

    @classmethod
    def for_user(cls, user: User, tenant_slug: str | None) -> Caller:
        """A staff user acts as `user:<username>` inside one of their tenants.

        With several tenants the request must name one (X-Toolhub-Tenant), so a
        call never lands in a tenant by accident.
        """
        tenants = tenants_where(user)  # any role: the call's own checks ask the rest
        if tenant_slug:
            tenant = tenants.filter(slug=tenant_slug).first()
            if tenant is None:
                raise NoTenant(f"You are not a member of tenant {tenant_slug!r}.")
        else:
            found = list(tenants[:2])
            if len(found) != 1:
                raise NoTenant("Name the tenant to act in with the X-Toolhub-Tenant header.")
            tenant = found[0]
        return cls(tenant=tenant, principal=f"user:{user.get_username()}", user=user)


# A held call's tenant and requesting user by id, as of the authorization epoch: a worker
# takes them from here for each call it runs, at the epoch that call's checks are answered
# at, instead of joining both to its batch's read of approvals (issue 13). Editing either
# row changes the epoch.
_REQUESTERS = EpochCache("requesters")


def requester(tenant_id: int, user_id: int) -> tuple[Tenant, User]:
    """The tenant's and the user's rows, as of the epoch (DoesNotExist if one is gone)."""

    def load() -> tuple[Tenant, User]:
        return Tenant.objects.get(pk=tenant_id), get_user_model().objects.get(pk=user_id)

    return _REQUESTERS.get((tenant_id, user_id), load)


class UnknownPrincipal(Exception):
    """A dry run on behalf of a principal the tenant has never issued a key or setup for."""


def on_behalf(staff: User, tenant_slug: str, principal: str) -> Caller:
    """A staff member asking as one of their tenant's principals (the dry run only).

    The principal must already have its service user (a key or a setup made it): asking
    never creates one, and a typo is answered as such instead of "denied".
    """
    if not getattr(staff, "is_staff", False):
        raise NoTenant("Only staff may ask on behalf of a principal.")
    tenant = tenants_where(staff).filter(slug=tenant_slug).first()
    if tenant is None:
        raise NoTenant(f"You are not a member of tenant {tenant_slug!r}.")
    if not tenants_where(staff, ON_BEHALF_PERMISSION).filter(pk=tenant.pk).exists():
        raise NoTenant(
            f"Your role in tenant {tenant_slug!r} does not allow asking on behalf of its "
            "principals: that is a tenant admin's."
        )
    try:
        user = existing_service_user(tenant, principal)
    except UnmappablePrincipal as exc:
        raise UnknownPrincipal(exc.messages[0]) from None
    if user is None:
        raise UnknownPrincipal(f"Tenant {tenant.slug} has no principal {principal!r}.")
    return Caller(tenant=tenant, principal=principal, user=user)


class ApiPrincipal:
    """The DRF `request.user` for API-key requests: not a Django user."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.caller = Caller.for_api_key(key)

    def __str__(self) -> str:
        return self.key.principal

    def get_username(self) -> str:
        return self.key.principal


def is_api_principal(user: AbstractBaseUser | AnonymousUser | ApiPrincipal | None) -> bool:
    return isinstance(user, ApiPrincipal)
