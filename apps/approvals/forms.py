from __future__ import annotations

import uuid
from typing import Any

from django import forms

from apps.approvals.decisions import BULK_LIMIT
from toolhub.web import json_input


class DecisionForm(forms.Form):
    """The console's approve / edit-and-approve / reject form."""

    action = forms.ChoiceField(
        choices=[("approve", "approve"), ("edit", "edit"), ("reject", "reject")]
    )
    reason = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2})
    )
    args = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"})
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "reject" and not (data.get("reason") or "").strip():
            self.add_error("reason", "Say why you reject it: the reason goes back to the agent.")
        if data.get("action") == "edit":
            try:
                edited = json_input.loads(data.get("args") or "")
            except json_input.JsonInputError as exc:
                reason = f"are refused. {exc}" if exc.limit else "are not valid JSON."
                self.add_error("args", f"The edited arguments {reason}")
            else:
                if not isinstance(edited, dict):
                    self.add_error("args", "The edited arguments must be a JSON object.")
                data["edited"] = edited
        return data


class BulkDecisionForm(forms.Form):
    """The queue's bulk approve / reject: the ticked calls' ids, one reason for all."""

    action = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    reason = forms.CharField(required=False, max_length=1000)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "reject" and not (data.get("reason") or "").strip():
            self.add_error("reason", "Say why you reject them: the reason goes back to each agent.")
        raw = self.data.getlist("ids") if hasattr(self.data, "getlist") else []
        if not raw:
            self.add_error(None, "Tick the calls to decide first.")
        elif len(raw) > BULK_LIMIT:
            self.add_error(None, f"Decide at most {BULK_LIMIT} calls at once.")
        else:
            try:
                data["ids"] = [str(uuid.UUID(value)) for value in raw]
            except ValueError:
                self.add_error(None, "A ticked call is not one of the queue's; reload the page.")
        return data
