"""System checks of the invocations app (manage.py check, and every start-up that runs
the checks: migrate, runserver)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from apps.invocations.hooks import pipeline


@register()
def hooks_load(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """TOOLHUB_HOOKS: every entry must name a Hook that loads with its options."""
    return [
        Error(problem, hint="See docs/hooks.md.", id="invocations.E001")
        for problem in pipeline.problems(settings.TOOLHUB_HOOKS)
    ]
