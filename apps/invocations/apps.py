from django.apps import AppConfig


class InvocationsConfig(AppConfig):
    name = "apps.invocations"
    label = "invocations"
