"""Roles per tenant (issue 42): Tenant.members becomes the Membership table, which names
the member's role in that tenant.

Each existing membership gets the largest role whose permissions the member held
globally before (directly or through a group): the tenant admin's set gives `admin`, the
operator's `operator`, anything less `member` (what membership alone gave). Nobody is
wider than before: a role never holds a permission its member lacked. Then those global
permissions are removed from every non-superuser and group, since the role backend no
longer reads them (keeping them would only mislead). Superusers are unchanged.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The role permission sets as of this migration (apps/tenants/roles.py may grow later).
OPERATOR = {
    "tools.decide_approval",
    "tools.view_tool",
    "approvals.view_approvalrequest",
    "invocations.view_invocationrecord",
    "invocations.view_runevent",
    "planning.view_plan",
}
ADMIN = (
    OPERATOR
    | {"tenants.view_tenant"}
    | {
        f"{app}.{action}_{model}"
        for app, model in (
            ("policies", "policy"),
            ("policies", "policyrule"),
            ("connections", "connection"),
            ("connections", "grant"),
            ("tenants", "apikey"),
        )
        for action in ("view", "add", "change", "delete")
    }
)


def _global_permissions(apps, user_id):
    Permission = apps.get_model("auth", "Permission")
    rows = Permission.objects.filter(
        models.Q(user__pk=user_id) | models.Q(group__user__pk=user_id)
    ).values_list("content_type__app_label", "codename")
    return {f"{app}.{codename}" for app, codename in rows}


def _governed(apps):
    Permission = apps.get_model("auth", "Permission")
    query = models.Q(pk__in=[])
    for name in ADMIN:
        app, codename = name.split(".")
        query |= models.Q(content_type__app_label=app, codename=codename)
    return Permission.objects.filter(query)


def roles_from_global_permissions(apps, schema_editor):
    Membership = apps.get_model("tenants", "Membership")
    User = apps.get_model("auth", "User")
    Group = apps.get_model("auth", "Group")
    for user_id in set(Membership.objects.values_list("user_id", flat=True)):
        held = _global_permissions(apps, user_id)
        role = "admin" if held >= ADMIN else "operator" if held >= OPERATOR else "member"
        Membership.objects.filter(user_id=user_id).update(role=role)
    governed = list(_governed(apps))
    for user in User.objects.filter(is_superuser=False, user_permissions__in=governed).distinct():
        user.user_permissions.remove(*governed)
    for group in Group.objects.filter(permissions__in=governed).distinct():
        group.permissions.remove(*governed)


def back_to_global_permissions(apps, schema_editor):
    """Reversing gives each member the permissions of their widest role, globally (the
    old model could express nothing finer)."""
    Membership = apps.get_model("tenants", "Membership")
    User = apps.get_model("auth", "User")
    governed = {f"{p.content_type.app_label}.{p.codename}": p for p in _governed(apps)}
    for user in User.objects.filter(pk__in=Membership.objects.values("user_id")):
        roles = set(Membership.objects.filter(user=user).values_list("role", flat=True))
        names = ADMIN if "admin" in roles else OPERATOR if "operator" in roles else set()
        user.user_permissions.add(*(governed[name] for name in names))


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("tenants", "0003_webhook_private_network"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        # The role permissions must exist before they are read.
        ("tools", "0001_initial"),
        ("approvals", "0001_initial"),
        ("invocations", "0001_initial"),
        ("planning", "0001_initial"),
        ("policies", "0001_initial"),
        ("connections", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The auto-created table tenants_tenant_members (id, tenant_id, user_id, unique
            # pair) is the Membership table: the state learns it, the database keeps it.
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to="tenants.tenant",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "tenants_tenant_members",
                        "unique_together": {("tenant", "user")},
                    },
                ),
                migrations.AlterField(
                    model_name="tenant",
                    name="members",
                    field=models.ManyToManyField(
                        blank=True,
                        help_text="Staff users of this tenant; each membership names their role here.",
                        related_name="tenants",
                        through="tenants.Membership",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[
                    ("operator", "operator"),
                    ("admin", "tenant admin"),
                    ("member", "member (console runs and streams only)"),
                ],
                default="member",
                max_length=16,
            ),
        ),
        migrations.RunPython(roles_from_global_permissions, back_to_global_permissions),
    ]
