from typing import Any

from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save


class PoliciesConfig(AppConfig):
    name = "apps.policies"
    label = "policies"

    def ready(self) -> None:
        from apps.policies.models import Policy, PolicyRule

        # Every write of a policy, a rule or a listing changes the policies epoch, which
        # evaluators are kept under (apps/policies/policy.py). (Their bulk writes: their
        # querysets. A tool deleted drops its listings: apps/tools/rows.py.)
        for model in (Policy, PolicyRule):
            label = model._meta.label
            post_save.connect(policies_written, sender=model, dispatch_uid=f"pe-save-{label}")
            post_delete.connect(policies_written, sender=model, dispatch_uid=f"pe-del-{label}")
        m2m_changed.connect(listing_changed, sender=Policy.tools.through, dispatch_uid="pe-m2m")


def policies_written(instance: Any, **_signal_kwargs: Any) -> None:
    """A policy or a rule saved or deleted: its policy is the change (the log of the
    policies epoch, apps/tenants/epoch.py)."""
    from apps.policies.models import PolicyRule
    from apps.tenants import epoch

    key = instance.policy_id if isinstance(instance, PolicyRule) else instance.pk
    epoch.bump_row(epoch.POLICIES_ROW, [key])


def listing_changed(
    action: str, instance: Any, reverse: bool, pk_set: set[Any] | None, **_signal_kwargs: Any
) -> None:
    """A policy's listed tools changed: from the policy's side the policy is the change;
    from a tool's side (`reverse`), the policies added or removed (a clear names none)."""
    from apps.tenants import epoch

    if action in ("post_add", "post_remove", "post_clear"):
        keys = pk_set if reverse else [instance.pk]
        epoch.bump_row(epoch.POLICIES_ROW, keys)
