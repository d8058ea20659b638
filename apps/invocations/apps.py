from django.apps import AppConfig


class InvocationsConfig(AppConfig):
    name = "apps.invocations"
    label = "invocations"

    def ready(self) -> None:
        from apps.invocations import revocations  # noqa: F401  (connects its signal receiver)
