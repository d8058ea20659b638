"""One service user per (tenant, principal), never shared (issue 42).

Service usernames used to be `<kind>+<name>@<slug>` cut at 150 characters: a long
principal lost its tenant's slug, and two tenants' principals could share one user (and
one tenant's key carried the other's group and object permissions). apps/tenants/
principals.py now names such pairs `_h+<sha256>@<slug>`.

Split rather than refuse: refusing would leave the host unable to upgrade until someone
edited users by hand, while splitting never widens anyone. Every key whose user is not
its pair's user moves to that pair's own service user (created, in the tenant's agents
group, no password). The old user's own grants (its global and object permissions, its
groups other than agents groups) are copied only when one pair alone used it: then they
were that pair's. When several pairs shared it, nobody can tell whose a grant was, so
none is copied, and the migration names the pairs whose per-user grants a tenant admin
must give again (their agents group's grants apply at once). The old user keeps its rows
and no longer has keys.
"""

import hashlib
from collections import defaultdict

from django.contrib.auth.hashers import make_password
from django.db import migrations

USERNAME_MAX = 150
AGENTS_SUFFIX = ": agents"


def username_for(slug, principal):
    plain = f"{principal.replace(':', '+', 1)}@{slug}"
    if len(plain) <= USERNAME_MAX:
        return plain
    digest = hashlib.sha256(f"{slug}\n{principal}".encode()).hexdigest()
    return f"_h+{digest}@{slug}"


def split_shared_service_users(apps, schema_editor):
    ApiKey = apps.get_model("tenants", "ApiKey")
    User = apps.get_model("auth", "User")
    Group = apps.get_model("auth", "Group")
    UserObjectPermission = apps.get_model("guardian", "UserObjectPermission")
    misbound = defaultdict(list)  # (tenant, principal) -> keys bound to another name
    for key in ApiKey.objects.select_related("tenant", "user"):
        if key.user.username != username_for(key.tenant.slug, key.principal):
            misbound[(key.tenant, key.principal)].append(key)
    if not misbound:
        return
    pairs_of_user = defaultdict(set)
    for key in ApiKey.objects.filter(user__in={k.user_id for ks in misbound.values() for k in ks}):
        pairs_of_user[key.user_id].add((key.tenant_id, key.principal))
    regrant = []
    for (tenant, principal), keys in misbound.items():
        user, created = User.objects.get_or_create(
            username=username_for(tenant.slug, principal),
            defaults={"password": make_password(None)},
        )
        group, _ = Group.objects.get_or_create(name=f"{tenant.slug}{AGENTS_SUFFIX}")
        user.groups.add(group)
        old_ids = {key.user_id for key in keys}
        ApiKey.objects.filter(pk__in=[key.pk for key in keys]).update(user=user)
        for old_id in old_ids:
            if len(pairs_of_user[old_id]) > 1:
                regrant.append(f"{principal} of tenant {tenant.slug}")
                continue
            old = User.objects.get(pk=old_id)
            user.user_permissions.add(*old.user_permissions.all())
            user.groups.add(*old.groups.exclude(name__endswith=AGENTS_SUFFIX))
            for grant in UserObjectPermission.objects.filter(user=old):
                UserObjectPermission.objects.get_or_create(
                    user=user,
                    permission=grant.permission,
                    content_type=grant.content_type,
                    object_pk=grant.object_pk,
                )
    if regrant:
        print(  # noqa: T201 - a migration's only way to tell the operator
            "\n  tenants.0005: these principals shared a service user with another "
            "tenant's; their keys now have their own, with their agents group's grants. "
            "Give them again any grant made to the principal alone: " + "; ".join(regrant)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_membership_roles"),
        ("guardian", "0003_remove_groupobjectpermission_guardian_gr_content_ae6aec_idx_and_more"),
    ]

    operations = [migrations.RunPython(split_shared_service_users, migrations.RunPython.noop)]
