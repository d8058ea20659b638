from django.apps import AppConfig


class InvocationsConfig(AppConfig):
    name = "apps.invocations"
    label = "invocations"

    def ready(self) -> None:
        from apps.invocations import checks, revocations  # noqa: F401  (registers them)
