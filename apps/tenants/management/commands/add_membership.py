from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from guardian.conf import settings as guardian_settings

from apps.tenants.management.commands.create_staff import parse_role
from apps.tenants.models import Membership, Tenant
from apps.tenants.principals import AGENTS_SUFFIX
from apps.tenants.roles import grant_role


class Command(BaseCommand):
    help = (
        "Give an existing person a role in a tenant (or change their role there). This "
        "widens what they may do, so it is for whoever runs the host, like a superuser in "
        "the admin. Their roles in other tenants are unchanged."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", required=True, help="operator, admin or member")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        role = parse_role(options["role"])
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        username = options["username"]
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}; create staff with create_staff.")
        if (
            username == guardian_settings.ANONYMOUS_USER_NAME
            or user.groups.filter(name__endswith=AGENTS_SUFFIX).exists()
        ):
            raise CommandError(
                f"User {username!r} is an agent's service user (or guardian's anonymous "
                "user), not a person: it cannot be staff."
            )
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive; a superuser reactivates it.")
        before = Membership.objects.filter(tenant=tenant, user=user).first()
        grant_role(user, tenant, role)
        was = f" (was {before.role})" if before is not None else ""
        self.stdout.write(f"{username} is now {role.value} of tenant {tenant.slug}{was}.")
