"""A quick password hasher for the test process.

Django 6 hashes a password with 1,500,000 PBKDF2 iterations: 1-3 s on this machine class,
paid by every user a test makes with a password and every password login, hundreds of
times a run. This hasher is the same algorithm (`pbkdf2_sha256`) with few iterations. A
hash keeps its iteration count, so a server process started by a test (production
settings) verifies these hashes as they are, and re-hashes them at full strength on a
login, as it would any hash made with an older Django's count.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000


def use_quick_hasher(settings: Any) -> None:
    """Put the quick hasher in the place of the default one, in this process only."""
    from django.contrib.auth import hashers

    default = "django.contrib.auth.hashers.PBKDF2PasswordHasher"
    quick = f"{__name__}.{QuickPBKDF2PasswordHasher.__name__}"
    settings.PASSWORD_HASHERS = [quick, *(h for h in settings.PASSWORD_HASHERS if h != default)]
    hashers.reset_hashers(setting="PASSWORD_HASHERS")  # what a settings change does
