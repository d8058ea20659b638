"""The planning suite: a run-scoped todo list an agent keeps while it works.

The plan lives in the database per tenant and run (through the `plans`
capability); the rules (step ids never reused, all steps done -> completed) live
with the Plan model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import Redaction, ToolContext, ToolContract, ToolOutput, ToolParams

StepTitle = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]
StepStatus = Literal["pending", "in_progress", "done"]


class SetupPlanParams(ToolParams):
    objective: StepTitle = Field(description="What the plan is for")
    initial_steps: list[StepTitle] = Field(default_factory=list, max_length=100)


class AddStepParams(ToolParams):
    steps: list[StepTitle] = Field(min_length=1, max_length=100)


class UpdateStepParams(ToolParams):
    step_id: int = Field(ge=1)
    title: StepTitle | None = None
    status: StepStatus | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> UpdateStepParams:
        if self.title is None and self.status is None:
            raise ValueError("give a new title, a new status, or both")
        return self


class ReadPlanParams(ToolParams):
    pass


class PlanStepOut(ToolOutput):
    step_id: int
    title: str
    status: StepStatus


class PlanOut(ToolOutput):
    objective: str
    status: Literal["active", "completed"]
    steps: list[PlanStepOut]


def setup_plan(params: SetupPlanParams, ctx: ToolContext, caps: Capabilities) -> dict[str, Any]:
    ctx.check_cancelled()  # a write of a cancelled call is not made
    return caps.require("plans").setup(params.objective, params.initial_steps)


def add_step(params: AddStepParams, ctx: ToolContext, caps: Capabilities) -> dict[str, Any]:
    ctx.check_cancelled()  # a write of a cancelled call is not made
    return caps.require("plans").add_steps(params.steps)


def update_step(params: UpdateStepParams, ctx: ToolContext, caps: Capabilities) -> dict[str, Any]:
    ctx.check_cancelled()  # a write of a cancelled call is not made
    return caps.require("plans").update_step(params.step_id, params.title, params.status)


def read_plan(params: ReadPlanParams, ctx: ToolContext, caps: Capabilities) -> dict[str, Any]:
    return caps.require("plans").read()


_REDACTION = Redaction(
    result=("objective", "status", "steps.step_id", "steps.title", "steps.status"), args=()
)


def _contract(
    name: str, description: str, params: type[ToolParams], execute: Any, **extra: Any
) -> ToolContract:
    return ToolContract(
        name=f"planning_{name}",
        description=description,
        params=params,
        result=PlanOut,
        execute=execute,
        effect=extra.pop("effect", "state_change"),
        redaction=extra.pop("redaction", _REDACTION),
        capabilities=("plans",),
        tags=("planning",),
        **extra,
    )


CONTRACTS = [
    _contract(
        "setup_plan",
        "Create the plan for this run, or replace it: an objective and optional first steps.",
        SetupPlanParams,
        setup_plan,
        redaction=Redaction(result=_REDACTION.result, args=("objective", "initial_steps")),
    ),
    _contract(
        "add_step",
        "Append steps to this run's active plan.",
        AddStepParams,
        add_step,
        redaction=Redaction(result=_REDACTION.result, args=("steps",)),
    ),
    _contract(
        "update_step",
        "Change a step's title or status (pending, in_progress, done) in this run's plan.",
        UpdateStepParams,
        update_step,
        redaction=Redaction(result=_REDACTION.result, args=("step_id", "title", "status")),
    ),
    _contract(
        "read_plan",
        "Read this run's plan: objective, status and steps.",
        ReadPlanParams,
        read_plan,
        effect="read_only",
    ),
]
