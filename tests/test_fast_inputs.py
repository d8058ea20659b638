"""toolhub/web/fast_inputs.py writes the markup Django's form templates write."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.utils.html import format_html

from toolhub.web.fast_inputs import FAST, speed_up

pytestmark = [pytest.mark.one_leg]

ATTRS: list[dict[str, Any]] = [
    {},
    {"class": "action-select", "aria-label": 'Select "<b>" & more'},
    # Safe text (the admin's row label, made by format_html) is not escaped twice.
    {"class": "action-select", "aria-label": format_html("Select {}", '"<b>" & more')},
    {"required": True, "disabled": False, "maxlength": 20, "data-x": None},
]
VALUES: list[Any] = [None, "", True, False, 0, 7, "a\"<b>'&", "run-1", format_html("{}", "<&>")]


@pytest.mark.parametrize("slow", list(FAST))
def test_each_fast_widget_renders_as_its_template(slow: type[forms.Widget]) -> None:
    for attrs in ATTRS:
        for value in VALUES:
            for name in ("form-0-enabled", 'odd"<name>'):
                expected = slow(attrs=dict(attrs)).render(name, value)
                assert FAST[slow](attrs=dict(attrs)).render(name, value) == expected


def test_a_form_keeps_its_widgets_state_and_other_widgets() -> None:
    class Form(forms.Form):
        enabled = forms.BooleanField(required=False)
        note = forms.CharField(widget=forms.Textarea)
        when = forms.DateField(widget=forms.DateInput)  # a template of its own: kept

    form = Form(initial={"enabled": True, "note": "x"})
    before = {name: str(form[name]) for name in form.fields}
    speed_up(form)
    assert type(form.fields["enabled"].widget) is FAST[forms.CheckboxInput]
    assert type(form.fields["note"].widget) is forms.Textarea
    assert type(form.fields["when"].widget) is forms.DateInput
    assert {name: str(form[name]) for name in form.fields} == before
