"""Tenant scoping for every admin page, and the tenants, keys, users and groups admins.

A staff member who is not a superuser sees and edits only their tenants' rows
(`apps.tenants.scoping`): lists, change/delete/history pages, actions, autocomplete and
raw-id lookups (they read the target admin's `get_queryset`), foreign-key and
many-to-many choices (`get_field_queryset` offers what the target admin shows), list
filters, saves (`save_model` refuses a row of another tenant), and guardian's
object-permission pages (only their tenants' users and groups). Every ModelAdmin of
toolhub derives from `TenantScopedAdmin` or uses `ScopedChoicesMixin`;
tests/admin/test_scoping.py walks `admin.site._registry` to prove it.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.filters import RelatedOnlyFieldListFilter
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import BaseModelAdmin
from django.contrib.admin.utils import NotRelationField, get_fields_from_path, unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, ValidationError
from django.db.models import Exists, JSONField, Model, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django_tasks_db.admin import DBTaskResultAdmin
from django_tasks_db.models import DBTaskResult
from guardian.admin import (
    AdminGroupObjectPermissionsForm,
    AdminUserObjectPermissionsForm,
    GroupManage,
    GuardedModelAdminMixin,
    UserManage,
)
from guardian.shortcuts import get_groups_with_perms, get_users_with_perms

from apps.tenants.models import ApiKey, Membership, Tenant
from apps.tenants.principals import people
from apps.tenants.roles import ROLE_GOVERNED
from apps.tenants.scoping import is_superuser, staff_tenants, visible_groups, visible_users
from toolhub.web.fast_inputs import speed_up
from toolhub.web.fast_list import LeanChangeList
from toolhub.web.json_input import JSONFormField
from toolhub.web.paging import CappedCountPaginator


def scoped_choices(site: admin.AdminSite, request: HttpRequest, model: type[Model]) -> Any:
    """The rows of `model` a staff member may pick: what its own admin shows them.

    None means "no restriction" (superusers, and models the admin does not show).
    """
    if is_superuser(request.user):
        return None
    target = site._registry.get(model)
    return None if target is None else target.get_queryset(request)


class ScopedChoicesMixin(BaseModelAdmin[Any]):
    """Foreign-key and many-to-many choices limited to what the staff member may see.

    The form field's queryset is also what validates a POST, so a forged id of
    another tenant's row is refused as "not one of the available choices".

    Every admin derives from it, so it also gives every model JSONField the form field
    that reads with toolhub.web.json_input: JSON nested too deeply is a form error, not a 500.
    """

    formfield_overrides = {JSONField: {"form_class": JSONFormField}}

    def get_field_queryset(self, db: Any, db_field: Any, request: HttpRequest) -> Any:
        queryset = super().get_field_queryset(db, db_field, request)
        scoped = scoped_choices(self.admin_site, request, db_field.remote_field.model)
        if scoped is None:
            return queryset
        if queryset is None:
            queryset = db_field.remote_field.model._default_manager.using(db)
        return queryset.filter(pk__in=scoped.values("pk"))


def tenants_holding(model: type[Model], tenant_field: str = "tenant", **match: Any) -> list[int]:
    """The tenants with a row of `model` matching, one index probe each (an EXISTS that
    stops at the first row), so that the rows are then read as `tenant IN (those) AND
    …` by an index that leads with the tenant. With every tenant as a subquery instead,
    PostgreSQL may walk a whole such index for its second column (the events' search by
    run took 200 ms over 3 x 10^7 events, issue 45)."""
    rows = model._default_manager.order_by().filter(**{tenant_field: OuterRef("pk")}, **match)
    return list(Tenant.objects.order_by().filter(Exists(rows)).values_list("pk", flat=True))


class TenantScopedAdmin(ScopedChoicesMixin, admin.ModelAdmin[Any]):
    """Staff see and save only the rows of tenants where their role allows it (superusers:
    all): a row is listed when their role in its tenant gives the model's view or change
    permission, and changed, added or deleted when it gives that permission
    (`role_allows`, `apps.tenants.roles`). A tenant admin of A who is an operator of B sees
    B's approvals and records, and none of B's policies, connections, grants or keys.

    `tenant_field` is the lookup from a row to its tenant ("" when the row is a tenant);
    admins of rows that belong to no tenant override `scope_queryset` and `in_scope`.
    `superuser_only_fields` are shown read-only to everyone else.
    """

    tenant_field = "tenant"
    superuser_only_fields: tuple[str, ...] = ()
    # Lists never count a whole table (toolhub.web.paging); no "(N total)" beside a filter.
    paginator = CappedCountPaginator
    show_full_result_count = False
    # Tables that grow with traffic (records, events, approvals): search matches whole
    # ids only ("=field", an index each), never part of a text, which reads every row.
    exact_search_only = False
    # exact_search_only fields whose index leads with the tenant (see `exact_match`).
    searched_per_tenant: tuple[str, ...] = ()
    # The list reads none of the JSON columns it does not show (toolhub.web.fast_list.
    # LeanChangeList): for admins whose list displays read no JSON column.
    lean_list = False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LeanChangeList if self.lean_list else super().get_changelist(request, **kwargs)

    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's row checkbox (`ModelAdmin.action_checkbox`, its CheckboxInput through
        the form templates), written directly: the same markup, a hundred times a page."""
        label, value = html.escape(str(obj)), html.escape(str(obj.pk))
        return mark_safe(  # noqa: S308 (both values escaped)
            f'<input type="checkbox" name="{ACTION_CHECKBOX_NAME}" value="{value}"'
            f' class="action-select" aria-label="Select this object for an action - {label}">'
        )

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        """list_editable's forms, one per row, with their inputs written directly."""
        formset = super().get_changelist_formset(request, **kwargs)

        class FastFormSet(formset):  # type: ignore[misc, valid-type]
            def add_fields(self, form: Any, index: Any) -> None:
                super().add_fields(form, index)
                speed_up(form)

        return FastFormSet

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", None) or {}
        cl = changelist.get("cl")
        if cl is None:
            return response
        if getattr(cl.paginator, "capped", False):
            cap = cl.paginator.cap
            messages.info(
                request,
                f"More than {cap:,} rows match: the list pages through the first {cap:,}. "
                "Narrow it with the filters or the search to reach the others.",
            )
        if self.exact_search_only and cl.query and not cl.result_count:
            messages.warning(
                request,
                f"Nothing has the id {cl.query!r}. This list is searched by whole ids only "
                "(a part of a name or message would mean reading every row): use the "
                "filters for a tenant, status or date.",
            )
        return response

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """exact_search_only: the whole term equals one of the fields, compared as stored
        (`exact`; the admin's "=" is `iexact`, which PostgreSQL cannot answer from an
        index); a field the term cannot be (a UUID) is skipped."""
        if not self.exact_search_only:
            return super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(pk__in=[])
        for name in self.search_fields:
            path = name.removeprefix("=")
            try:
                value = get_fields_from_path(self.model, path)[-1].to_python(term)
            except ValidationError:
                continue
            matches |= self.exact_match(path, value)
        return queryset.filter(matches), False

    def exact_match(self, path: str, value: Any) -> Q:
        """The rows whose `path` equals `value`, as a condition an index answers. A field
        indexed only after the tenant (`(tenant, run_id, …)`) is looked up in the tenants
        that have it, found first by one index probe per tenant (an EXISTS that stops at
        the first row), so the page is `tenant IN (the few that match) AND run_id = …`:
        with one tenant, the index's own order (`created_at DESC, id DESC` for the
        records' runs) gives the newest rows of a 100,000-call run without sorting it,
        rather than every matching row read and sorted across tenants."""
        if path in self.searched_per_tenant:
            having = tenants_holding(self.model, self.tenant_field, **{path: value})
            return Q(**{f"{self.tenant_field}__in": having, path: value})
        return Q(**{path: value})

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return self.rows_allowed(request, queryset, "view", "change")

    def rows_allowed(
        self, request: HttpRequest, queryset: QuerySet[Any], *actions: str
    ) -> QuerySet[Any]:
        """The rows of tenants where the user may do one of `actions` on this model."""
        lookup = f"{self.tenant_field}__in" if self.tenant_field else "pk__in"
        return queryset.filter(**{lookup: self.tenants_allowing(request, *actions).values("pk")})

    def tenants_allowing(self, request: HttpRequest, *actions: str) -> QuerySet[Tenant]:
        """The tenants where the user may do one of `actions` on this model: where their
        role gives it; for a permission no role names (a superuser granted it globally,
        e.g. tenants.change_tenant), every tenant they have a role in, as before roles."""
        user = request.user
        perms = [self.permission(action) for action in actions]
        if any(perm not in ROLE_GOVERNED and user.has_perm(perm) for perm in perms):
            return staff_tenants(user)
        return staff_tenants(user, *perms)

    def permission(self, action: str) -> str:
        return f"{self.opts.app_label}.{get_permission_codename(action, self.opts)}"

    def row_tenant_id(self, obj: Any) -> int | None:
        """The tenant `obj` belongs to, by `tenant_field` (None: none, or not yet set)."""
        *path, last = (self.tenant_field or "pk").split("__")
        owner = obj
        for step in path:
            owner = getattr(owner, step, None)
        value = getattr(owner, last if last == "pk" else f"{last}_id", None)
        return value if isinstance(value, int) else None

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        """Whether the staff member has any role in obj's tenant."""
        tenant_id = self.row_tenant_id(obj)
        return tenant_id is not None and staff_tenants(request.user).filter(pk=tenant_id).exists()

    def role_allows(self, request: HttpRequest, obj: Any, *actions: str) -> bool:
        """Whether the staff member's role in obj's tenant gives one of `actions` on this
        model; rows of no tenant (tools, users, groups) answer by the admin's `in_scope`."""
        if is_superuser(request.user):
            return True
        tenant_id = self.row_tenant_id(obj)
        if tenant_id is None:
            return self.in_scope(request, obj)
        return self.tenants_allowing(request, *actions).filter(pk=tenant_id).exists()

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_view_permission(request, obj)
        return allowed and (obj is None or self.role_allows(request, obj, "view", "change"))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_change_permission(request, obj)
        return allowed and (obj is None or self.role_allows(request, obj, "change"))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or self.role_allows(request, obj, "delete"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        if is_superuser(request.user):
            return queryset
        return self.scope_queryset(request, queryset)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # The form's choices already refuse other tenants; this holds for any field
        # a subclass adds without a scoped queryset, and for a tenant where the role
        # shows rows but does not allow this edit.
        if not is_superuser(request.user) and not self.role_allows(
            request, obj, "change" if change else "add"
        ):
            raise PermissionDenied("Your role in that row's tenant does not allow this change.")
        super().save_model(request, obj, form, change)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """The bulk delete action: every row must be one the role may delete."""
        if not is_superuser(request.user) and not all(
            self.role_allows(request, obj, "delete") for obj in queryset
        ):
            raise PermissionDenied("Your role in a selected row's tenant does not allow deleting.")
        super().delete_queryset(request, queryset)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        """The form knows whether a superuser edits it (`edited_by_superuser`), for rules
        beyond read-only fields (e.g. ConnectionForm's hosts once private networks are on)."""
        # change= by keyword: UserAdmin's get_form takes it only among **kwargs.
        form = super().get_form(request, obj, change=change, **kwargs)
        form.edited_by_superuser = is_superuser(request.user)  # type: ignore[attr-defined]
        return form

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if not is_superuser(request.user):
            fields += [f for f in self.superuser_only_fields if f not in fields]
        return fields

    def get_list_filter(self, request: HttpRequest) -> Any:
        """Relation filters list only related rows in scope, not every tenant's names."""
        filters = super().get_list_filter(request)
        if is_superuser(request.user):
            return filters
        return [self._related_only(item) for item in filters]

    def _related_only(self, item: Any) -> Any:
        if not isinstance(item, str):
            return item
        try:
            field = get_fields_from_path(self.model, item)[-1]
        except (FieldDoesNotExist, NotRelationField):
            return item
        return (item, RelatedOnlyFieldListFilter) if field.is_relation else item


class TenantScopedGuardedAdmin(GuardedModelAdminMixin, TenantScopedAdmin):  # type: ignore[misc]
    """Guardian's object-permission pages, limited to the staff member's users and groups.

    The overview lists only their tenants' users and groups holding permissions; the
    user and group pages 404 for anyone else; non-superusers may assign only the
    model's own permissions (e.g. execute_tool, use_connection), not add/change/delete.
    """

    def obj_perms_manage_view(self, request: HttpRequest, object_pk: str) -> HttpResponse:
        if not self.has_change_permission(request, None):
            return HttpResponseRedirect(reverse("admin:index", current_app=self.admin_site.name))
        obj = get_object_or_404(self.get_queryset(request), pk=unquote(object_pk))
        user_ids = set(visible_users(request.user).values_list("pk", flat=True))
        group_ids = set(visible_groups(request.user).values_list("pk", flat=True))
        users_with_perms: dict[Any, Any] = get_users_with_perms(  # type: ignore[assignment]
            obj, attach_perms=True, with_group_users=False
        )
        groups_with_perms: dict[Any, Any] = get_groups_with_perms(obj, attach_perms=True)  # type: ignore[assignment]
        users_perms = OrderedDict(
            sorted(
                ((user, perms) for user, perms in users_with_perms.items() if user.pk in user_ids),
                key=lambda item: item[0].get_username(),
            )
        )
        groups_perms = OrderedDict(
            sorted(
                (
                    (group, perms)
                    for group, perms in groups_with_perms.items()
                    if group.pk in group_ids
                ),
                key=lambda item: item[0].name,
            )
        )
        user_form = self.get_obj_perms_user_select_form(request)(
            request.POST if "submit_manage_user" in request.POST else None
        )
        group_form = self.get_obj_perms_group_select_form(request)(
            request.POST if "submit_manage_group" in request.POST else None
        )
        prefix = f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}"
        if request.method == "POST" and user_form.is_bound and user_form.is_valid():
            url = f"{prefix}_permissions_manage_user"
            return HttpResponseRedirect(
                reverse(url, args=[obj.pk, user_form.cleaned_data["user"].pk])
            )
        if request.method == "POST" and group_form.is_bound and group_form.is_valid():
            url = f"{prefix}_permissions_manage_group"
            return HttpResponseRedirect(
                reverse(url, args=[obj.pk, group_form.cleaned_data["group"].pk])
            )
        context = self.get_obj_perms_base_context(request, obj)
        context.update(
            users_perms=users_perms,
            groups_perms=groups_perms,
            user_form=user_form,
            group_form=group_form,
        )
        request.current_app = self.admin_site.name
        return render(request, self.get_obj_perms_manage_template(), context)

    def obj_perms_manage_user_view(
        self, request: HttpRequest, object_pk: str, user_id: str
    ) -> HttpResponse:
        if not _has_visible(visible_users(request.user), user_id):
            raise Http404("No such user among your tenants' users.")
        response: HttpResponse = super().obj_perms_manage_user_view(request, object_pk, user_id)
        return response

    def obj_perms_manage_group_view(
        self, request: HttpRequest, object_pk: str, group_id: str
    ) -> HttpResponse:
        if not _has_visible(visible_groups(request.user), group_id):
            raise Http404("No such group among your tenants' groups.")
        response: HttpResponse = super().obj_perms_manage_group_view(request, object_pk, group_id)
        return response

    def get_obj_perms_user_select_form(self, request: HttpRequest) -> type[forms.Form]:
        allowed = visible_users(request.user)

        class ScopedUserManage(UserManage):
            def clean_user(self) -> Any:
                user = super().clean_user()
                if not allowed.filter(pk=user.pk).exists():
                    raise ValidationError(self.fields["user"].error_messages["does_not_exist"])
                return user

        return ScopedUserManage

    def get_obj_perms_group_select_form(self, request: HttpRequest) -> type[forms.Form]:
        allowed = visible_groups(request.user)

        class ScopedGroupManage(GroupManage):
            def clean_group(self) -> Any:
                group = super().clean_group()
                if not allowed.filter(pk=group.pk).exists():
                    raise ValidationError(self.fields["group"].error_messages["does_not_exist"])
                return group

        return ScopedGroupManage

    def get_obj_perms_manage_user_form(self, request: HttpRequest) -> Any:
        if is_superuser(request.user):
            return AdminUserObjectPermissionsForm
        return _own_permissions_only(AdminUserObjectPermissionsForm)

    def get_obj_perms_manage_group_form(self, request: HttpRequest) -> Any:
        if is_superuser(request.user):
            return AdminGroupObjectPermissionsForm
        return _own_permissions_only(AdminGroupObjectPermissionsForm)


def _has_visible(queryset: QuerySet[Any], pk: str) -> bool:
    try:
        return queryset.filter(pk=queryset.model._meta.pk.to_python(pk)).exists()
    except ValidationError:
        return False


def _own_permissions_only(form_class: Any) -> Any:
    """Only the model's declared permissions (execute_tool, use_connection, ...)."""

    class OwnPermissionsForm(form_class):
        def get_obj_perms_field_choices(self) -> list[tuple[str, str]]:
            declared = {codename for codename, _ in self.obj._meta.permissions}
            return [c for c in super().get_obj_perms_field_choices() if c[0] in declared]

    return OwnPermissionsForm


class SuperuserOnlyChanges(TenantScopedAdmin):
    """Rows others may only look at: adding, changing and deleting is for superusers."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return is_superuser(request.user) and super().has_add_permission(request, *args)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_superuser(request.user) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_superuser(request.user) and super().has_delete_permission(request, obj)


class MembershipInline(ScopedChoicesMixin, admin.TabularInline[Membership, Tenant]):
    """Who is staff of the tenant, and their role there: superusers only (TenantAdmin)."""

    model = Membership
    extra = 0
    fields = ("user", "role")
    raw_id_fields = ()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            # People only: guardian's AnonymousUser and agents' service users are no members.
            kwargs["queryset"] = people()
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    """Creating and deleting tenants, and their memberships (who has which role) and slug,
    stay with superusers: a membership widens someone.

    The slug names the tenant's groups and service users, so renaming it would move
    them in or out of a tenant's scope.
    """

    tenant_field = ""
    fields = ("slug", "name", "max_concurrent_calls")
    # A tenant's staff may not lift the limit that keeps it from crowding out the others.
    superuser_only_fields = ("slug", "max_concurrent_calls")
    list_display = ("slug", "name", "created_at")

    search_fields = ("slug", "name")

    def get_inlines(self, request: HttpRequest, obj: Any) -> Any:
        return [MembershipInline] if is_superuser(request.user) else []

    def has_add_permission(self, request: HttpRequest) -> bool:
        return is_superuser(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_superuser(request.user) and super().has_delete_permission(request, obj)


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    """A new key's plaintext is shown once, on the page that answers the save.

    It never goes into a message: the messages framework keeps messages in a cookie
    (or the session), where the plaintext would outlive the page.
    """

    list_display = (
        "display_prefix",
        "principal",
        "tenant",
        "name",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("tenant", "revoked_at")
    search_fields = ("principal", "name", "prefix")
    readonly_fields = ("display_prefix", "created_at", "last_used_at")
    actions = ("revoke_keys",)
    created_template = "admin/tenants/apikey/created.html"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        # The key is bound to its tenant's service user for this principal when created.
        return [*fields, "tenant", "principal"] if obj is not None else fields

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if obj is None:  # a key being made has no prefix, dates or revocation yet
            unset = {"display_prefix", "created_at", "last_used_at", "revoked_at"}
            fields = [f for f in fields if f not in unset]
        return fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        raw = None
        if not change:
            obj.bind_service_user()
            raw = obj.assign_new_secret()
        super().save_model(request, obj, form, change)
        if raw:
            request._new_api_key = raw  # type: ignore[attr-defined]  # read by response_add

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        raw = getattr(request, "_new_api_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API key created",
            "key": obj,
            "raw_key": raw,
            "changelist_url": reverse("admin:tenants_apikey_changelist"),
            "add_url": reverse("admin:tenants_apikey_add"),
        }
        response = TemplateResponse(request, self.created_template, context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset.filter(revoked_at__isnull=True):
            key.revoke()


admin.site.unregister(User)
admin.site.unregister(Group)
admin.site.unregister(DBTaskResult)


@admin.register(User)
class ScopedUserAdmin(SuperuserOnlyChanges, UserAdmin):
    """Staff see their tenants' members and service users, read-only.

    Changing a user (password, staff flags, groups, permissions) could reach into
    another tenant through a shared member, or escalate; superusers do it.
    """

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(pk__in=visible_users(request.user).values("pk"))

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        return visible_users(request.user).filter(pk=obj.pk).exists()


@admin.register(Group)
class ScopedGroupAdmin(SuperuserOnlyChanges, GroupAdmin):
    """Staff see their tenants' groups ("<slug>: ..."), read-only."""

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(pk__in=visible_groups(request.user).values("pk"))

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        return visible_groups(request.user).filter(pk=obj.pk).exists()


class SuperusersOnly(SuperuserOnlyChanges):
    """Rows of no tenant that reach every tenant (task results, MCP servers): invisible
    to tenant staff."""

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.none()

    def in_scope(self, request: HttpRequest, obj: Any) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_superuser(request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_superuser(request.user)


@admin.register(DBTaskResult)
class ScopedTaskResultAdmin(SuperusersOnly, DBTaskResultAdmin):
    """Task results belong to no tenant and carry any tenant's ids: superusers only."""
