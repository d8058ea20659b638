"""Inputs written without the template engine, for admin lists of a hundred rows.

A changelist renders an action checkbox per row, and with `list_editable` a form per row
(the editable fields and the row's hidden id): three hundred widgets on the tools list,
each through Django's form templates (`input.html`, which includes `attrs.html`), about a
third of the page's time. These write the same markup as those templates directly.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.html import conditional_escape as escape
from django.utils.safestring import SafeString, mark_safe


def render_input(context: dict[str, Any]) -> SafeString:
    """`django/forms/widgets/input.html` and its `attrs.html`, as Python (each name and
    value escaped as the templates' autoescape does: text already safe is kept)."""
    widget = context["widget"]
    parts = [f'<input type="{escape(widget["type"])}" name="{escape(widget["name"])}"']
    if widget["value"] is not None:
        parts.append(f' value="{escape(widget["value"])}"')
    for name, value in widget["attrs"].items():
        if value is True:
            parts.append(f" {escape(name)}")
        elif value is not False:
            parts.append(f' {escape(name)}="{escape(value)}"')
    return mark_safe("".join(parts) + ">")  # noqa: S308 (every part escaped above)


class FastInputMixin:
    """A widget of `input.html` (or a template that only includes it) rendered directly."""

    def _render(self, template_name: str, context: dict[str, Any], renderer: Any = None) -> Any:
        return render_input(context)


class FastCheckboxInput(FastInputMixin, forms.CheckboxInput):
    pass


class FastHiddenInput(FastInputMixin, forms.HiddenInput):
    pass


class FastTextInput(FastInputMixin, forms.TextInput):
    pass


class FastNumberInput(FastInputMixin, forms.NumberInput):
    pass


# Exactly these classes (a subclass may have a template of its own).
FAST: dict[type[forms.Widget], type[forms.Widget]] = {
    forms.CheckboxInput: FastCheckboxInput,
    forms.HiddenInput: FastHiddenInput,
    forms.TextInput: FastTextInput,
    forms.NumberInput: FastNumberInput,
}


def speed_up(form: forms.BaseForm) -> None:
    """Give the form's plain inputs their direct rendering (same markup, same state)."""
    for field in form.fields.values():
        fast = FAST.get(type(field.widget))
        if fast is not None:
            field.widget.__class__ = fast
