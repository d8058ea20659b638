from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import MaxLengthValidator, validate_slug

from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant. It has no policy, so it may use no tool until an admin allows some."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["slug"]
        try:
            validate_slug(slug)
            MaxLengthValidator(Tenant._meta.get_field("slug").max_length)(slug)
        except ValidationError:
            raise CommandError(
                f"{slug!r} is not a slug: use up to 64 letters, digits, - and _."
            ) from None
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"Tenant {slug!r} already exists.")
        Tenant.objects.create(slug=slug, name=options["name"] or slug)
        self.stdout.write(f"Created tenant {slug} (no policy yet: it may use no tool).")
