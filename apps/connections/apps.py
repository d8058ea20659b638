from django.apps import AppConfig


class ConnectionsConfig(AppConfig):
    name = "apps.connections"
    label = "connections"

    def ready(self) -> None:
        from apps.connections import crypto

        # A malformed TOOLHUB_ENCRYPTION_KEY fails at start-up, not at the first call.
        crypto.check_keys()
