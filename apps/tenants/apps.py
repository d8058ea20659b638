from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    label = "tenants"

    def ready(self) -> None:
        from apps.tenants import epoch, openapi  # noqa: F401 - openapi registers the bearer scheme

        epoch.connect()
        epoch.checkout_sql()
