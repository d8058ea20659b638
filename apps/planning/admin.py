from __future__ import annotations

from django.contrib import admin

from apps.planning.models import Plan, PlanStep
from apps.tenants.admin import ScopedChoicesMixin, TenantScopedAdmin


class PlanStepInline(ScopedChoicesMixin, admin.TabularInline[PlanStep, Plan]):
    model = PlanStep
    extra = 0


@admin.register(Plan)
class PlanAdmin(TenantScopedAdmin):
    list_display = ("run_id", "tenant", "objective", "status", "updated_at")
    list_filter = ("tenant", "status")
    search_fields = ("run_id", "objective")
    inlines = [PlanStepInline]
