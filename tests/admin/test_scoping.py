"""Every registered ModelAdmin, walked as a one-tenant staff member holding every permission.

Nothing here names a model: a new ModelAdmin is walked as soon as it is registered. If the
walk finds no row of another tenant for it, it fails and asks for one in
tests/admin/support.py's `populate`, so an unscoped admin cannot pass by having no data.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.db.models import Model
from django.test import Client
from django.urls import reverse
from guardian.admin import GuardedModelAdminMixin
from guardian.shortcuts import get_group_perms, get_user_perms

from tests.admin.support import World, form_data, registered_models

MARK = "globex"  # every string of the other tenant contains it, nothing of acme's does
GLOBAL_MODELS = {"tools.tool"}  # a catalog shared by every tenant: it has no "other tenant"

pytestmark = pytest.mark.django_db

MODELS = [pytest.param(m, id=m._meta.label_lower) for m in registered_models()]


def url(model: type[Model], view: str, *args: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def assert_hidden(response: Any) -> None:
    assert response.status_code != 200 or MARK not in response.content.decode(), (
        f"{response.request['PATH_INFO']} shows another tenant's rows"
    )


def relations(model: type[Model]) -> list[Any]:
    return [
        f
        for f in model._meta.get_fields()
        if f.is_relation and f.concrete and (f.many_to_one or f.many_to_many or f.one_to_one)
    ]


def own_object(world: World, model: type[Model]) -> Any:
    own = world.own[model] or [
        o for o in model._default_manager.all()[:50] if o not in world.foreign[model]
    ]
    return own[0] if own else None


@pytest.mark.parametrize("model", MODELS)
def test_it_has_rows_of_another_tenant_to_hide(world: World, model: type[Model]) -> None:
    if model._meta.label_lower not in GLOBAL_MODELS:
        assert world.foreign[model], f"add a {model._meta.label} row to populate()"


@pytest.mark.parametrize("model", MODELS)
def test_the_changelist_lists_no_row_of_another_tenant(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    pk_name = model._meta.pk.attname
    for query in ("", "?q=lobex", f"?_popup=1&_to_field={pk_name}", "?o=1"):
        response = staff_client.get(url(model, "changelist") + query)
        assert response.status_code in (200, 403)
        assert_hidden(response)
        for obj in world.foreign[model]:
            assert url(model, "change", obj.pk) not in response.content.decode()


@pytest.mark.parametrize("model", MODELS)
def test_another_tenants_rows_are_not_reachable_by_url(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    views = ["change", "delete", "history"]
    if isinstance(admin.site._registry[model], GuardedModelAdminMixin):
        views.append("permissions")
    for obj in world.foreign[model]:
        for view in views:
            response = staff_client.get(url(model, view, obj.pk))
            assert response.status_code in (302, 403, 404), (view, obj)
            assert_hidden(response)
        staff_client.post(url(model, "delete", obj.pk), {"post": "yes"})
        assert model._default_manager.filter(pk=obj.pk).exists()
        staff_client.post(
            url(model, "changelist"),
            {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"},
        )
        assert model._default_manager.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("model", MODELS)
def test_forms_offer_no_choice_of_another_tenant(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    assert_hidden(staff_client.get(url(model, "add")))
    own = own_object(world, model)
    if own is not None:
        assert_hidden(staff_client.get(url(model, "change", own.pk)))


@pytest.mark.parametrize("model", MODELS)
def test_a_forged_post_naming_another_tenants_row_is_refused(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    own = own_object(world, model)
    if own is None:
        return
    page = staff_client.get(url(model, "change", own.pk))
    if page.status_code != 200:
        return
    data = form_data(page.content.decode(), model)
    if "_save" not in page.content.decode():  # read-only: any POST must change nothing
        data["_save"] = ["Save"]
    for field in relations(model):
        foreign = world.foreign.get(field.related_model) or []
        if not foreign:
            continue
        before = _related(own, field)
        forged = {**data, field.name: [str(foreign[0].pk)], "_save": ["Save"]}
        staff_client.post(url(model, "change", own.pk), forged)
        assert _related(model._default_manager.get(pk=own.pk), field) == before, field.name
        count = model._default_manager.count()
        staff_client.post(url(model, "add"), forged)
        created = model._default_manager.exclude(
            pk__in=[o.pk for o in model._default_manager.all()[:count]]
        )
        assert not created.filter(**{field.name: foreign[0].pk}).exists(), field.name
    # The same form, unforged, is accepted where the admin lets staff edit it:
    # the refusals above were about the other tenant, not a malformed POST.
    if "_save" in page.content.decode():
        response = staff_client.post(url(model, "change", own.pk), {**data, "_save": ["Save"]})
        assert response.status_code == 302, response.content.decode()[:3000]


def _related(obj: Any, field: Any) -> Any:
    if field.many_to_many:
        return set(getattr(obj, field.name).values_list("pk", flat=True))
    return getattr(obj, field.attname)


@pytest.mark.parametrize("model", MODELS)
def test_autocomplete_offers_no_row_of_another_tenant(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    for field in relations(model):
        for term in ("", "lobex"):
            response = staff_client.get(
                "/admin/autocomplete/",
                {
                    "app_label": model._meta.app_label,
                    "model_name": model._meta.model_name,
                    "field_name": field.name,
                    "term": term,
                },
            )
            assert response.status_code in (200, 403, 404), field.name
            assert_hidden(response)


@pytest.mark.parametrize("model", MODELS)
def test_object_permission_pages_show_and_accept_only_own_users_and_groups(
    world: World, staff_client: Client, model: type[Model]
) -> None:
    if not isinstance(admin.site._registry[model], GuardedModelAdminMixin):
        return
    from django.contrib.auth.models import Group, User

    own = own_object(world, model)
    base = url(model, "permissions", own.pk)
    held = {u.pk: set(get_user_perms(u, own)) for u in world.foreign[User]}
    held_by_groups = {g.pk: set(get_group_perms(g, own)) for g in world.foreign[Group]}
    assert staff_client.get(base).status_code == 200
    assert_hidden(staff_client.get(base))
    for user in world.foreign[User]:
        response = staff_client.post(base, {"user": user.username, "submit_manage_user": "1"})
        assert response.status_code == 200  # the form refuses the name; no redirect
        page = f"{base}user-manage/{user.pk}/"
        assert staff_client.get(page).status_code == 404
        staff_client.post(page, {"permissions": [p for p, _ in model._meta.permissions]})
        assert set(get_user_perms(user, own)) == held[user.pk]
    for group in world.foreign[Group]:
        response = staff_client.post(base, {"group": group.name, "submit_manage_group": "1"})
        assert response.status_code == 200
        page = f"{base}group-manage/{group.pk}/"
        assert staff_client.get(page).status_code == 404
        staff_client.post(page, {"permissions": [p for p, _ in model._meta.permissions]})
        assert set(get_group_perms(group, own)) == held_by_groups[group.pk]


def test_a_policy_cannot_apply_to_another_tenants_group(world: World, root_client: Client) -> None:
    """A superuser sees every group: the policy's tenant, not the form, decides which fit."""
    from django.contrib.auth.models import Group

    from apps.policies.models import Policy

    own = next(policy for policy in world.own[Policy] if policy.group is not None)
    page = root_client.get(url(Policy, "change", own.pk))
    data = form_data(page.content.decode(), Policy)
    theirs = Group.objects.get(name="globex: agents")
    response = root_client.post(
        url(Policy, "change", own.pk), {**data, "group": [str(theirs.pk)], "_save": ["Save"]}
    )
    assert response.status_code == 200
    assert "is not a group of tenant &#x27;acme&#x27;" in response.content.decode()
    own.refresh_from_db()
    assert own.group is not None and own.group.name == "acme: agents"
    # The same form with the tenant's own group saves.
    response = root_client.post(url(Policy, "change", own.pk), {**data, "_save": ["Save"]})
    assert response.status_code == 302, response.content.decode()[:2000]
