"""Every admin form reads JSON with toolhub.web.json_input: JSON nested too deeply is a form error.

Walks every registered ModelAdmin and its inlines, so a JSONField added later is covered.
"""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.contrib import admin
from django.db.models import JSONField, Model
from django.test import Client, RequestFactory
from django.urls import reverse

from apps.connections.models import Connection
from tests.admin.support import World, form_data, registered_models
from tests.support.deep_json import (
    DEEP_ARRAYS,
    DEEP_OBJECTS,
    OVER_DEPTH,
    TOO_DEEP,
    logged_tracebacks,
)
from toolhub.web.json_input import JSONFormField

pytestmark = pytest.mark.django_db


def admin_forms(world: World) -> list[tuple[str, type[forms.ModelForm[Any]]]]:
    """Each registered admin's change form and its inlines' forms, as a superuser gets them."""
    request = RequestFactory().get("/admin/")
    request.user = world.superuser
    found: list[tuple[str, type[forms.ModelForm[Any]]]] = []
    for model, model_admin in admin.site._registry.items():
        obj = (world.own[model] or world.foreign[model] or [None])[0]
        found.append((model._meta.label, model_admin.get_form(request, obj, change=True)))
        for inline in model_admin.get_inline_instances(request, obj):
            found.append((inline.model._meta.label, inline.get_formset(request, obj).form))
    return found


def json_textareas(model: type[Model], form: type[forms.ModelForm[Any]]) -> list[str]:
    """The form's fields that take a model JSONField as text."""
    names = {f.name for f in model._meta.get_fields() if isinstance(f, JSONField)}
    return [
        name
        for name, field in form.base_fields.items()
        if name in names and isinstance(field.widget, forms.Textarea)
    ]


def test_every_admin_json_form_field_reads_with_the_json_input_parser(world):
    checked = []
    for label, form in admin_forms(world):
        for name, field in form.base_fields.items():
            if isinstance(field, forms.JSONField):
                assert isinstance(field, JSONFormField), f"{label}.{name}"
                checked.append(f"{label}.{name}")
    assert "mcp.McpTool.redaction_args" in checked


def change_page(obj: Any) -> str:
    meta = obj._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])


def test_json_nested_too_deeply_is_a_form_error_on_every_admin_change_page(
    world: World, root_client: Client, caplog: pytest.LogCaptureFixture
):
    posted = set()
    for model in registered_models():
        rows = world.own[model]
        if not rows:
            continue
        url = change_page(rows[0])
        page = root_client.get(url)
        form = page.context["adminform"].form if page.status_code == 200 else None
        if form is None or "_save" not in page.content.decode():
            continue  # read-only to a superuser too
        data = form_data(page.content.decode(), model)
        for name in json_textareas(model, type(form)):
            for text in (DEEP_ARRAYS, OVER_DEPTH, DEEP_OBJECTS):
                response = root_client.post(url, {**data, name: [text], "_save": ["Save"]})
                assert response.status_code == 200, (model, name)
                errors = response.context["adminform"].form.errors
                assert name in errors, (model, name)
                if text.startswith("[") or model is not Connection:  # hosts: a JSON list
                    assert any(TOO_DEEP in e for e in errors[name]), (model, name, errors)
                posted.add(f"{model._meta.label}.{name}")
    assert {"mcp.McpTool.redaction_args", "connections.Connection.allowed_hosts"} <= posted
    assert logged_tracebacks(caplog) == []
