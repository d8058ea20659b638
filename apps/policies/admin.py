from __future__ import annotations

from django import forms
from django.contrib import admin

from apps.policies.models import Policy, PolicyRule
from apps.tenants.admin import ScopedChoicesMixin, TenantScopedAdmin
from apps.tools.models import Effect


class PolicyForm(forms.ModelForm[Policy]):
    approval_effects = forms.MultipleChoiceField(
        choices=Effect.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Calls of tools with these effects wait for a human.",
    )

    class Meta:
        model = Policy
        fields = [
            "tenant", "name", "description", "enabled", "group", "principal", "tools",
            "tool_patterns", "approval_effects", "max_runtime_ms", "max_result_bytes",
            "calls_per_minute", "approval_timeout_minutes", "four_eyes", "high_consequence_quorum",
        ]  # fmt: skip


class PolicyRuleInline(ScopedChoicesMixin, admin.TabularInline[PolicyRule, Policy]):
    model = PolicyRule
    extra = 0
    fields = ("position", "tool_pattern", "condition", "outcome", "description")


@admin.register(Policy)
class PolicyAdmin(TenantScopedAdmin):
    form = PolicyForm
    list_display = ("name", "tenant", "group", "principal", "enabled", "updated_at")
    list_filter = ("tenant", "enabled")
    search_fields = ("name", "description", "principal")
    filter_horizontal = ("tools",)
    inlines = [PolicyRuleInline]
    fieldsets = (
        (None, {"fields": ("tenant", "name", "description", "enabled")}),
        ("Who it applies to", {"fields": ("group", "principal")}),
        ("What it allows", {"fields": ("tools", "tool_patterns", "approval_effects")}),
        ("Budgets", {"fields": ("max_runtime_ms", "max_result_bytes", "calls_per_minute")}),
        (
            "Human approval",
            {"fields": ("approval_timeout_minutes", "four_eyes", "high_consequence_quorum")},
        ),
    )
