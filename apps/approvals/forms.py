from __future__ import annotations

from typing import Any

from django import forms

from toolhub import json_input


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
