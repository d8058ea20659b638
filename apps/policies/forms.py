"""The setup page's and the dry-run page's forms, limited to the staff member's tenants."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from apps.connections.models import Connection
from apps.policies.models import PolicyRule
from apps.tenants.callers import ON_BEHALF_PERMISSION
from apps.tenants.models import Tenant, validate_principal
from apps.tenants.scoping import tenants_allowing
from apps.tools.models import Tool
from toolhub.web import json_input

# What "Let a principal use a tool" writes: a policy (added or changed) and a grant.
SETUP_PERMISSIONS = ("policies.add_policy", "policies.change_policy", "connections.add_grant")

CEL_HELP = (
    "CEL over the call. Variables: args (the validated arguments), tool.id, tool.effect, "
    "tool.consequenceLevel, principal, runId. Examples: args.amount > 100 · "
    '!args.url.startsWith("https://api.example.com/") · principal == "agent:ops". '
    "A field the call may omit must be tested first: has(args.cc) && size(args.cc) > 0 "
    "(reading an absent field denies the call and names this rule). A condition must cost "
    "little: one that could hold the server for more than about 2 ms (nested loops, map or "
    "filter over args, costly patterns) is refused, saying which part costs too much."
)
POSITION_HELP = (
    "Display order. Every matching rule counts (deny beats approval beats allow); when "
    "several of the same outcome match, the first by position is the one recorded."
)


class PolicyRuleForm(forms.ModelForm[PolicyRule]):
    """Narrow widgets so the rules table fits a 1280 px screen with its errors beside it."""

    class Meta:
        model = PolicyRule
        fields = ["position", "tool_pattern", "condition", "outcome", "description"]
        widgets = {
            "position": forms.NumberInput(attrs={"style": "width: 3.5em"}),
            "tool_pattern": forms.TextInput(attrs={"style": "width: 9em"}),
            "condition": forms.Textarea(attrs={"rows": 2, "style": "width: 18em"}),
            "description": forms.TextInput(attrs={"style": "width: 9em"}),
        }
        help_texts = {"condition": CEL_HELP, "position": POSITION_HELP}


class TenantScopedForm(forms.Form):
    """A form whose tenant and connection choices are the tenants where the staff member's
    role gives every one of `permissions`, and only those."""

    permissions: tuple[str, ...] = ()

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none())
    principal = forms.CharField(
        max_length=160,
        validators=[validate_principal],
        help_text="e.g. agent:support-bot: the principal its API keys were issued to.",
    )
    connection = forms.ModelChoiceField(
        queryset=Connection.objects.none(),
        required=False,
        help_text="Only for tools that take a connection (e.g. core__http_request).",
    )

    def __init__(self, user: User, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tenants = tenants_allowing(user, *self.permissions)
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        self.fields["connection"].queryset = Connection.objects.filter(  # type: ignore[attr-defined]
            tenant__in=tenants
        ).select_related("tenant")
        if tenants.count() == 1:
            self.fields["tenant"].initial = tenants.first()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tenant, connection = data.get("tenant"), data.get("connection")
        if tenant is not None and connection is not None and connection.tenant_id != tenant.pk:
            self.add_error("connection", "This connection belongs to another tenant.")
        return data


class SetupForm(TenantScopedForm):
    permissions = SETUP_PERMISSIONS
    tool = forms.ModelChoiceField(
        queryset=Tool.objects.filter(available=True),
        help_text="Disabled tools are listed too; a superuser must enable them before use.",
    )
    approval = forms.BooleanField(
        required=False,
        label="Hold every call for a human",
        help_text="Unticked: calls run at once, unless another policy asks for approval.",
    )
    field_order = ["tenant", "principal", "tool", "connection", "approval"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        tool = data.get("tool")
        if tool is not None and tool.requires_connection and data.get("connection") is None:
            self.add_error("connection", f"{tool.id} needs a connection: choose one.")
        return data


class SimulationForm(TenantScopedForm):
    permissions = (ON_BEHALF_PERMISSION,)
    tool_id = forms.CharField(
        max_length=200,
        label="Tool",
        help_text="A tool id, e.g. core__http_request (an unknown id answers unavailable).",
    )
    args = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        initial="{}",
        help_text='The arguments as a JSON object, e.g. {"url": "https://api.example.com/"}.',
    )
    run_id = forms.CharField(required=False, max_length=128, help_text="Optional run id.")
    field_order = ["tenant", "principal", "tool_id", "args", "connection", "run_id"]

    def clean_args(self) -> str:
        text = self.cleaned_data.get("args") or "{}"
        try:
            json_input.loads(text)
        except json_input.JsonInputError as exc:
            reason = str(exc) if exc.limit else "Not JSON."
            raise ValidationError(f"{reason} The dry run would answer invalid_json.") from None
        return text
