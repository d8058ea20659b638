"""Run-scoped plans kept by the planning tools (seed 002's planning suite)."""

from __future__ import annotations

from typing import Any

from django.db import models

from apps.tenants.models import Tenant


class PlanError(Exception):
    """A rule of the plan was broken; the message is safe to show the model."""


class Plan(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        COMPLETED = "completed"

    # db_index=False: one_plan_per_run leads with it (tests/test_indexes.py).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="plans", db_index=False
    )
    run_id = models.CharField(max_length=128)
    objective = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    # Step ids count up for the life of the run's plan, across replacements,
    # so an id the model saw earlier never comes to mean another step.
    last_step_id = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "run_id"], name="one_plan_per_run")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.objective[:40]}"

    def replace(self, objective: str, titles: list[str]) -> None:
        self.steps.all().delete()
        self.objective = objective
        self._append(titles)

    def add_steps(self, titles: list[str]) -> None:
        if self.status == Plan.Status.COMPLETED:
            raise PlanError("The plan is completed; set up a new plan to continue.")
        self._append(titles)

    def update_step(self, step_id: int, title: str | None, status: str | None) -> None:
        step = self.steps.filter(step_id=step_id).first()
        if step is None:
            raise PlanError(f"The plan has no step {step_id}.")
        if title is not None:
            step.title = title
        if status is not None:
            step.status = status
        step.save()
        self._refresh_status()

    def _append(self, titles: list[str]) -> None:
        PlanStep.objects.bulk_create(
            PlanStep(plan=self, step_id=self.last_step_id + offset, title=title)
            for offset, title in enumerate(titles, start=1)
        )
        self.last_step_id += len(titles)
        self._refresh_status()

    def _refresh_status(self) -> None:
        statuses = list(self.steps.values_list("status", flat=True))
        done = bool(statuses) and all(s == PlanStep.Status.DONE for s in statuses)
        self.status = Plan.Status.COMPLETED if done else Plan.Status.ACTIVE
        self.save()

    def as_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "status": self.status,
            "steps": [
                {"step_id": s.step_id, "title": s.title, "status": s.status}
                for s in self.steps.order_by("step_id")
            ],
        }


class PlanStep(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        IN_PROGRESS = "in_progress"
        DONE = "done"

    # db_index=False: unique_step_id leads with it (tests/test_indexes.py).
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.PositiveIntegerField()
    title = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)

    class Meta:
        ordering = ["step_id"]
        constraints = [models.UniqueConstraint(fields=["plan", "step_id"], name="unique_step_id")]

    def __str__(self) -> str:
        return f"{self.step_id}. {self.title[:40]}"
