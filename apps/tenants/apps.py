from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    label = "tenants"

    def ready(self) -> None:
        from apps.tenants import openapi  # noqa: F401 - registers the schema's bearer scheme
