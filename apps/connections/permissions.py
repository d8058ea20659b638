"""Object permission `use_connection` (django-guardian), per connection or global."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apps.connections.models import Connection

if TYPE_CHECKING:
    from django.contrib.auth.models import User

USE = "connections.use_connection"


def can_use_connection(user: User, connection: Connection) -> bool:
    return user.is_active and (user.has_perm(USE) or user.has_perm(USE, connection))
