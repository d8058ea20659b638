"""The `plans` capability: the planning tools' view of one run's plan."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from apps.invocations.requests import MAX_RESULT_BYTES
from apps.planning.models import Plan, PlanError
from apps.tenants.models import Tenant
from apps.tools.contracts import ToolError


def _returnable(plan: Plan) -> dict[str, Any]:
    """The plan as the tools return it; refused (so the change rolls back) if too large.

    Called inside the change's transaction: a change whose result the runner would
    refuse as result_too_large must not be kept while the call reports a failure.
    """
    data = plan.as_dict()
    size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_RESULT_BYTES:
        raise ToolError(
            f"That change would make the plan too large to return ({size} bytes, the limit is "
            f"{MAX_RESULT_BYTES}); it was not applied. Use fewer or shorter steps, "
            "or set up a new plan."
        )
    return data


class DatabasePlanStore:
    def __init__(self, tenant: Tenant, run_id: str) -> None:
        self.tenant = tenant
        self.run_id = run_id

    def _locked_plan(self) -> Plan:
        plan = (
            Plan.objects.select_for_update().filter(tenant=self.tenant, run_id=self.run_id).first()
        )
        if plan is None:
            raise ToolError("This run has no plan yet; create one with core__planning_setup_plan.")
        return plan

    def setup(self, objective: str, steps: list[str]) -> dict[str, Any]:
        with transaction.atomic():
            plan, _ = Plan.objects.select_for_update().get_or_create(
                tenant=self.tenant, run_id=self.run_id, defaults={"objective": objective}
            )
            plan.replace(objective, steps)
            return _returnable(plan)

    def add_steps(self, steps: list[str]) -> dict[str, Any]:
        with transaction.atomic():
            plan = self._locked_plan()
            try:
                plan.add_steps(steps)
            except PlanError as exc:
                raise ToolError(str(exc)) from None
            return _returnable(plan)

    def update_step(self, step_id: int, title: str | None, status: str | None) -> dict[str, Any]:
        with transaction.atomic():
            plan = self._locked_plan()
            try:
                plan.update_step(step_id, title, status)
            except PlanError as exc:
                raise ToolError(str(exc)) from None
            return _returnable(plan)

    def read(self) -> dict[str, Any]:
        plan = Plan.objects.filter(tenant=self.tenant, run_id=self.run_id).first()
        if plan is None:
            raise ToolError("This run has no plan yet; create one with core__planning_setup_plan.")
        return plan.as_dict()
