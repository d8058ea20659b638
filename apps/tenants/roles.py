"""Staff roles, per tenant: what a member, an operator and a tenant admin may do there.

A membership (`Membership`: tenant, user, role) names a staff member's role in one
tenant; the same person may be a tenant admin of A and an operator of B. Every check on a
tenant's row asks the role in *that row's* tenant (`may`, and through it
`user.has_perm(perm, obj)` via `apps.tenants.backends.TenantRoleBackend`). The permissions
below are never global for anyone but superusers: the backend ignores them when a
superuser assigns them to a user or group directly.

- member: what membership alone gave before roles: the console's run pages and the
  streams of the tenant's runs, and deciding tools a superuser gave them
  `decide_approval` on. Nothing in the admin.
- operator: a member who may decide every held call of the tenant, and read its records,
  events, approvals, plans and webhook deliveries, and the tool catalog.
- admin: an operator who may also view, add, change and delete the tenant's policies
  (and their rules), connections, grants, API keys and approval webhooks, and view the
  tenant itself.

None may delete records or events (audit data), nor change users, groups, tenants'
membership or the global tool catalog: those stay with superusers.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission, User
from django.db.models import Model, Q, QuerySet

from apps.tenants.epoch import EpochCache
from apps.tenants.models import Membership, Role, Tenant

__all__ = ["Role", "grant_role", "may", "role_in", "tenants_where"]

OPERATOR_PERMISSIONS = (
    "tools.decide_approval",
    "tools.view_tool",
    "approvals.view_approvalrequest",
    "invocations.view_invocationrecord",
    "invocations.view_runevent",
    "planning.view_plan",
    "approvals.view_webhookdelivery",
)
ADMIN_MODELS = (
    "policies.policy",
    "policies.policyrule",
    "connections.connection",
    "connections.grant",
    "tenants.apikey",
    "approvals.approvalwebhook",
)
ADMIN_PERMISSIONS = (
    *OPERATOR_PERMISSIONS,
    "tenants.view_tenant",
    *(
        f"{label.split('.')[0]}.{action}_{label.split('.')[1]}"
        for label in ADMIN_MODELS
        for action in ("view", "add", "change", "delete")
    ),
)
ROLE_PERMISSIONS: dict[Role, frozenset[str]] = {
    Role.MEMBER: frozenset(),
    Role.OPERATOR: frozenset(OPERATOR_PERMISSIONS),
    Role.ADMIN: frozenset(ADMIN_PERMISSIONS),
}
# Permissions only a role gives (to non-superusers): a global grant of one means nothing.
ROLE_GOVERNED = frozenset().union(*ROLE_PERMISSIONS.values())

# user pk -> {tenant pk: role}, as of the authorization epoch (a membership's save or
# delete changes it), so the admin's many checks per page cost one query.
_ROLES = EpochCache("tenant roles")


def roles_of(user: Any) -> dict[int, Role]:
    """The user's role in each of their tenants (nothing for an inactive user)."""
    if not getattr(user, "is_active", False) or getattr(user, "pk", None) is None:
        return {}

    def load() -> dict[int, Role]:
        rows = Membership.objects.filter(user=user.pk).values_list("tenant_id", "role")
        return {tenant_id: Role(role) for tenant_id, role in rows}

    return _ROLES.get(user.pk, load)


def role_in(user: Any, tenant: Tenant | int | None) -> Role | None:
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return None if tenant_id is None else roles_of(user).get(tenant_id)


def tenant_id_of(obj: Any) -> int | None:
    """The tenant a row belongs to: itself for a tenant, its `tenant` (or its policy's, for a
    rule), None for rows of no tenant (tools, users)."""
    if isinstance(obj, Tenant):
        return obj.pk
    if isinstance(obj, Membership):
        return obj.tenant_id
    for path in ("tenant_id", "policy.tenant_id"):
        owner = obj
        for step in path.split("."):
            owner = getattr(owner, step, None)
        if isinstance(owner, int):
            return owner
    return None


def may(user: Any, perm: str, obj: Model | Tenant | int) -> bool:
    """May the user do `perm` ("app_label.codename") on `obj` (a row, a tenant or a tenant
    pk)? Superusers may; everyone else as their role in that tenant allows."""
    if not getattr(user, "is_active", False):
        return False
    if getattr(user, "is_superuser", False):
        return True
    tenant_id = obj if isinstance(obj, int) else tenant_id_of(obj)
    role = role_in(user, tenant_id)
    return role is not None and perm in ROLE_PERMISSIONS[role]


def tenant_ids_where(user: Any, *perms: str) -> set[int]:
    """Ids of the tenants where the user's role gives any of `perms` (none named: any role).
    Not for superusers, who hold everything everywhere (`tenants_where`)."""
    allowed = {role for role in Role if not perms or ROLE_PERMISSIONS[role] & set(perms)}
    return {tenant_id for tenant_id, role in roles_of(user).items() if role in allowed}


def tenants_where(user: Any, *perms: str) -> QuerySet[Tenant]:
    """The tenants where the user's role gives any of `perms` (none named: any role at all);
    every tenant for a superuser, none for an inactive or anonymous user."""
    if not getattr(user, "is_active", False) or getattr(user, "pk", None) is None:
        return Tenant.objects.none()
    if getattr(user, "is_superuser", False):
        return Tenant.objects.all()
    return Tenant.objects.filter(pk__in=tenant_ids_where(user, *perms))


def permissions_anywhere(user: Any) -> set[str]:
    """The role permissions the user holds in at least one tenant."""
    found: set[str] = set()
    for role in set(roles_of(user).values()):
        found |= ROLE_PERMISSIONS[role]
    return found


def check_permissions_exist() -> None:
    """Every role permission names a real permission (a renamed model would silently shrink
    a role)."""
    query = Q()
    for name in ROLE_GOVERNED:
        app_label, codename = name.split(".")
        query |= Q(content_type__app_label=app_label, codename=codename)
    found = {
        f"{app_label}.{codename}"
        for app_label, codename in Permission.objects.filter(query).values_list(
            "content_type__app_label", "codename"
        )
    }
    if missing := ROLE_GOVERNED - found:
        raise LookupError(f"Permissions missing for roles: {sorted(missing)}")


def grant_role(user: User, tenant: Tenant, role: Role) -> Membership:
    """Make the user staff of the tenant with this role there (replacing their role in that
    tenant; their roles elsewhere are untouched). Gives no global permission."""
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    membership, _ = Membership.objects.update_or_create(
        tenant=tenant, user=user, defaults={"role": role}
    )
    return membership
