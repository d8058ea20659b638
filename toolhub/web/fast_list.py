"""A changelist's rows written with what is the same for every row worked out once.

Django's `items_for_result` (django/contrib/admin/templatetags/admin_list.py) renders a
cell at a time and redoes per cell what holds for the whole page: the admin's empty
value, the boolean icons' static URLs (a storage lookup each), the row's change URL
(`reverse` and the preserved filters per row), a field's choices as a dict, the date
format (parsed per date), and a `format_html` per cell: 60-110 ms of CPU for a page of a
hundred rows. `result_list` here gives the `change_list_results.html` template the same
context with the same markup (tests/admin/test_fast_list.py compares it with Django's
for every registered admin); it is used for every changelist
(templates/admin/change_list.html).
"""

from __future__ import annotations

import contextlib
import datetime
import html
import uuid
from typing import Any
from urllib.parse import quote as url_quote

from django.conf import settings
from django.contrib.admin.templatetags import admin_list
from django.contrib.admin.templatetags.admin_list import (
    ResultList,
    result_headers,
    result_hidden_fields,
)
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import (
    display_for_field,
    display_for_value,
    get_fields_from_path,
    lookup_field,
    quote,
)
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist, ObjectDoesNotExist
from django.db import models
from django.db.models.constants import LOOKUP_SEP
from django.urls import NoReverseMatch, reverse
from django.utils import dateformat, formats, timezone
from django.utils.safestring import SafeString, mark_safe


def escape(text: Any) -> str:
    """django.utils.html.escape's text (without its lazy-argument wrapper)."""
    return html.escape(str(text))


def conditional_escape(text: Any) -> str:
    """django.utils.html.conditional_escape's text."""
    if hasattr(text, "__html__"):
        return str(text.__html__())
    return html.escape(str(text))


# Django's own, private: the boolean icon and a column's class name.
_boolean_icon = admin_list._boolean_icon  # type: ignore[attr-defined]
_coerce_field_name = admin_list._coerce_field_name  # type: ignore[attr-defined]

# dateformat's specifiers that are numbers (its "%04d" % year, "%02d" % month, ...).
_NUMBERS = {
    "Y": (4, "year"),
    "m": (2, "month"),
    "d": (2, "day"),
    "H": (2, "hour"),
    "i": (2, "minute"),
    "s": (2, "second"),
}


def _datetime_format() -> tuple[str, tuple[str, ...]] | None:
    """The language's DATETIME_FORMAT as a %-template and the attributes it reads, when
    it has only numeric specifiers (toolhub.formats: "Y-m-d H:i:s"); None otherwise.
    Split as dateformat.Formatter.format splits it."""
    template, attrs = [], []
    fmt = str(formats.get_format("DATETIME_FORMAT"))
    for i, piece in enumerate(dateformat.re_formatchars.split(fmt)):
        if i % 2:
            if piece not in _NUMBERS:
                return None
            width, attr = _NUMBERS[piece]
            template.append(f"%0{width}d")
            attrs.append(attr)
        elif piece:
            literal = dateformat.re_escaped.sub(r"\1", piece)
            template.append(literal.replace("%", "%%"))
    return "".join(template), tuple(attrs)


# What Django's URL resolver leaves unquoted in a reversed path (resolvers.py).
_PATH_SAFE = "!$&'()*+,;=" + "/~:@"


class _Page:
    """What every row of one changelist shares."""

    def __init__(self, cl: ChangeList) -> None:
        self.cl = cl
        self.empty = cl.model_admin.get_empty_value_display()
        self.pk_name = cl.model._meta.pk.name
        self.icons: dict[Any, SafeString] = {}
        self.choices: dict[models.Field[Any, Any], dict[Any, Any] | None] = {}
        self.columns = list(self._columns())
        self.datetimes = _datetime_format() if settings.USE_TZ else None
        self.tz = timezone.get_current_timezone()
        self.url_parts = self._url_parts()

    def _columns(self) -> Any:
        """(name, `field-<name>` class, whether it links, terminal field of a path)."""
        cl, first = self.cl, True
        for index, name in enumerate(cl.list_display):
            if cl.list_display_links is None:
                link = False
            elif first and not cl.list_display_links:
                link = True
            else:
                link = name in cl.list_display_links
            if link:
                first = False
            path_field = None
            if isinstance(name, str) and LOOKUP_SEP in name:
                with contextlib.suppress(FieldDoesNotExist):
                    path_field = get_fields_from_path(cl.model, name)[-1]
            yield name, f"field-{_coerce_field_name(name, index)}", link, path_field

    def _url_parts(self) -> tuple[str, str] | None:
        """The row link's escaped text before and after the quoted pk (None: reverse
        each row, as a ChangeList of its own may build its URLs otherwise)."""
        cl = self.cl
        if type(cl).url_for_result is not ChangeList.url_for_result:
            return None
        marker = uuid.uuid4().hex
        try:
            url = reverse(
                f"admin:{cl.opts.app_label}_{cl.opts.model_name}_change",
                args=(marker,),
                current_app=cl.model_admin.admin_site.name,
            )
        except NoReverseMatch:
            return None
        url = add_preserved_filters(
            {"preserved_filters": cl.preserved_filters, "opts": cl.opts}, url
        )
        parts = escape(url).split(marker)
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def icon(self, value: Any) -> SafeString:
        if value is not True and value is not False and value is not None:
            return _boolean_icon(value)
        if value not in self.icons:
            self.icons[value] = _boolean_icon(value)
        return self.icons[value]

    def for_field(self, value: Any, field: Any, empty: Any, link: bool) -> Any:
        """display_for_field, with choices and boolean icons looked up once a page."""
        if field.name != "password" and isinstance(field, models.BooleanField):
            if not getattr(field, "flatchoices", None) and (value is True or value is False):
                return self.icon(value)
        elif field.name != "password" and getattr(field, "flatchoices", None):
            if field not in self.choices:
                try:
                    self.choices[field] = dict(field.flatchoices)
                except TypeError:
                    self.choices[field] = None
            choices = self.choices[field]
            if choices is not None:
                try:
                    return choices.get(value, empty)
                except TypeError:
                    pass
        elif (
            self.datetimes is not None
            and field.name != "password"
            and isinstance(field, models.DateTimeField)
            and isinstance(value, datetime.datetime)
            and value.tzinfo is not None
            and value.utcoffset() is not None
            and getattr(value, "convert_to_local_time", True)
        ):
            # formats.localize(timezone.template_localtime(value)), the format split once.
            local = value.astimezone(self.tz)
            template, attrs = self.datetimes
            return template % tuple(getattr(local, attr) for attr in attrs)
        return display_for_field(value, field, empty, avoid_link=link)

    def url(self, result: Any) -> str | None:
        """The row's change URL, escaped (None: it has none)."""
        if self.url_parts is not None:
            pk = url_quote(str(quote(getattr(result, self.cl.pk_attname))), safe=_PATH_SAFE)
            return self.url_parts[0] + escape(pk) + self.url_parts[1]
        cl = self.cl
        try:
            url = cl.url_for_result(result)
        except NoReverseMatch:
            return None
        return escape(
            add_preserved_filters({"preserved_filters": cl.preserved_filters, "opts": cl.opts}, url)
        )

    def row(self, result: Any, form: Any) -> list[SafeString]:
        """items_for_result's cells for one row."""
        cl, cells, first = self.cl, [], True
        for name, field_class, link, path_field in self.columns:
            classes = field_class
            empty = self.empty
            editable = (
                not link
                and form is not None
                and name in form.fields
                and not (name == self.pk_name and form[self.pk_name].is_hidden)
            )
            try:
                field, attr, value = lookup_field(name, result, cl.model_admin)
            except ObjectDoesNotExist:
                shown: Any = empty
            else:
                empty = getattr(attr, "empty_value_display", empty)
                if field is None and path_field is not None:
                    field = path_field
                if field is None or field.auto_created:
                    if name == "action_checkbox":
                        classes = "action-checkbox"
                    boolean = getattr(attr, "boolean", False)
                    if isinstance(attr, property) and hasattr(attr, "fget"):
                        boolean = getattr(attr.fget, "boolean", False)
                    if editable:
                        shown = ""
                    elif boolean and (value is True or value is False):
                        shown = self.icon(value)
                    else:
                        shown = display_for_value(value, empty, boolean)
                    if isinstance(value, (datetime.date, datetime.time)):
                        classes += " nowrap"
                else:
                    if isinstance(field.remote_field, models.ManyToOneRel):
                        shown = empty if value is None else value
                    elif editable:
                        shown = ""
                    else:
                        shown = self.for_field(value, field, empty, link)
                    if isinstance(field, (models.DateField, models.TimeField, models.ForeignKey)):
                        classes += " nowrap"
            if link:
                tag = "th" if first else "td"
                first = False
                url = self.url(result)
                if url is None:
                    content = conditional_escape(shown)
                else:
                    popup = ""
                    if cl.is_popup:
                        attname = str(cl.to_field) if cl.to_field else cl.pk_attname
                        popup = f' data-popup-opener="{escape(result.serializable_value(attname))}"'
                    content = f'<a href="{url}"{popup}>{conditional_escape(shown)}</a>'
                cells.append(mark_safe(f'<{tag} class="{classes}">{content}</{tag}>'))  # noqa: S308
                continue
            if editable:
                bound = form[name]
                errors = str(bound.errors) if bound.errors else ""
                shown = mark_safe(errors + str(bound))  # noqa: S308 (rendered by the form)
            cells.append(mark_safe(f'<td class="{classes}">{conditional_escape(shown)}</td>'))  # noqa: S308
        if form is not None and not form[self.pk_name].is_hidden:
            cells.append(mark_safe(f"<td>{conditional_escape(form[self.pk_name])}</td>"))  # noqa: S308
        return cells


class Row(ResultList):
    """A row's cells (as Django's ResultList, with its form) and `html`, the cells
    joined, which templates/admin/change_list_results.html writes in one go."""

    def __init__(self, form: Any, cells: list[SafeString]) -> None:
        super().__init__(form, cells)
        self.html = mark_safe("".join(cells))  # noqa: S308 (cells are safe)


def results(cl: ChangeList) -> list[ResultList]:
    page = _Page(cl)
    if cl.formset:
        return [
            Row(form, page.row(result, form))
            for result, form in zip(cl.result_list, cl.formset.forms, strict=False)
        ]
    return [Row(None, page.row(result, None)) for result in cl.result_list]


def result_list(cl: ChangeList) -> dict[str, Any]:
    """Django's `result_list` context, with the rows from `results` above."""
    headers = list(result_headers(cl))
    return {
        "cl": cl,
        "result_hidden_fields": list(result_hidden_fields(cl)),
        "result_headers": headers,
        "num_sorted_fields": sum(1 for h in headers if h["sortable"] and h["sorted"]),
        "results": results(cl),
    }


class LeanChangeList(ChangeList):
    """Django's ChangeList, reading no JSON column the list does not show, of its rows or
    of the rows joined to them: a page of records, events or approvals decoded a hundred
    rows' arguments, results and messages (and their tools' schemas) only to drop them
    (issue 45: with building those rows, a third of a page). For an admin whose list
    displays touch no JSON column (`TenantScopedAdmin.lean_list`): a display that read one
    would cost a query a row."""

    def get_queryset(self, request: Any, exclude_parameters: Any = None) -> Any:
        qs = super().get_queryset(request, exclude_parameters)
        shown = {name for name in self.list_display if isinstance(name, str)}
        return qs.defer(*unshown_json(self.model, shown, qs.query.select_related))


def unshown_json(model: type[models.Model], shown: set[str], joined: Any) -> list[str]:
    """The JSON columns of `model` not in `shown`, and those of the models `joined` (a
    query's select_related: field names, one level) as `name__column`."""
    names = [
        field.name
        for field in model._meta.concrete_fields
        if isinstance(field, models.JSONField) and field.name not in shown
    ]
    for name in joined if isinstance(joined, dict) else ():
        related = model._meta.get_field(name).related_model
        if isinstance(related, type):
            names += [
                f"{name}__{field.name}"
                for field in related._meta.concrete_fields
                if isinstance(field, models.JSONField)
            ]
    return names
