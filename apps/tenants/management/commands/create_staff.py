from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from apps.tenants.models import Tenant
from apps.tenants.roles import Role, grant_role


class Command(BaseCommand):
    help = (
        "Create a staff member of one tenant with a role there: an operator (decides held "
        "calls) or a tenant admin (also edits the tenant's policies, connections, grants and "
        "API keys). Refuses an existing username: add_membership gives one a role."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--username", required=True)
        parser.add_argument("--password", required=True)
        parser.add_argument(
            "--email",
            default="",
            help="where approval notifications go; without one this person gets no mail",
        )
        parser.add_argument(
            "--role", default=Role.OPERATOR.value, help="operator (default), admin or member"
        )

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        role = self._role(options["role"])
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        username = options["username"]
        if User.objects.filter(username=username).exists():
            # Quietly widening an existing account (maybe another tenant's staff, or a
            # service user) is how escalations start: add_membership says it out loud.
            raise CommandError(
                f"User {username!r} already exists; create_staff only creates new staff "
                "members. To give an existing person a role in a tenant, run "
                "add_membership (or a superuser edits the tenant's memberships in the admin)."
            )
        user = User(username=username, email=options["email"].strip(), is_staff=True)
        try:
            user.full_clean(exclude=["password"])
            validate_password(options["password"], user=user)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        user.set_password(options["password"])
        user.save()
        grant_role(user, tenant, role)
        self.stdout.write(f"Staff member {username} created: {role.value} of tenant {tenant.slug}.")
        if not user.email and role is not Role.MEMBER:
            self.stdout.write(
                "No --email: this person gets no approval notifications (set one in the admin)."
            )

    def _role(self, value: str) -> Role:
        return parse_role(value)


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        choices = ", ".join(r.value for r in Role)
        raise CommandError(f"Unknown role {value!r}; choose one of: {choices}.") from None
