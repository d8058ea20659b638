"""Changelist rows written by toolhub.web.fast_list (issue 45): the markup Django's
`items_for_result` writes, for every registered admin, in a fixed number of queries."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.admin.templatetags import admin_list
from django.templatetags.static import static
from django.test import Client
from django.utils import timezone, translation

from apps.invocations.models import InvocationRecord
from apps.tools.admin import ToolAdmin
from apps.tools.models import Tool
from tests.admin.support import TOOL, World, queries_per_page_size
from toolhub.web import fast_list

pytestmark = pytest.mark.django_db

ODD_ID = "odd__a b/ü\"<x>&'(1)%"


def changelist(model: Any) -> str:
    return f"/admin/{model._meta.app_label}/{model._meta.model_name}/"


def rows(cl: Any, render: Any) -> list[tuple[Any, list[str]]]:
    return [(row.form, [str(cell) for cell in row]) for row in render(cl)]


def same_rows(client: Client, path: str) -> list[list[str]]:
    """The page's rows by Django's renderer and by fast_list, which must be equal; the
    page itself carries fast_list's (templates/admin/change_list.html)."""
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    cl = response.context["cl"]
    fast = rows(cl, fast_list.results)
    assert fast == rows(cl, admin_list.results), path
    page = response.content.decode()
    for _, cells in fast:
        assert "<tr>" + "".join(cells) + "</tr>" in page, path
    return [cells for _, cells in fast]


@pytest.fixture
def odd_tool(world: World) -> Tool:
    """A tool whose id needs quoting in a URL and escaping in HTML."""
    tool = Tool.objects.get(pk=TOOL)
    tool.pk, tool.enabled, tool.requires_confirmation = ODD_ID, False, True
    tool.save(force_insert=True)
    return tool


@pytest.fixture
def editable_tools(monkeypatch) -> None:
    """The tools list with an editable `enabled` column (no admin has one today; the rows'
    inputs are still written as Django writes them, for one that will)."""
    monkeypatch.setattr(admin.site._registry[Tool], "list_editable", ("enabled",))


def test_every_changelist_has_djangos_rows(world: World, root_client: Client, odd_tool) -> None:
    shown = 0
    for model in admin.site._registry:
        path = changelist(model)
        response = root_client.get(path)
        if response.status_code != 200 or "cl" not in (response.context or {}):
            continue
        shown += len(same_rows(root_client, path))
        # A popup (its rows' data-popup-opener), and links keeping a filter and an order.
        same_rows(root_client, path + "?_popup=1")
        same_rows(root_client, path + "?o=-1&q=a")
    assert shown > 20


@pytest.mark.parametrize(("language", "zone"), [("en-us", "UTC"), ("de", "Asia/Kathmandu")])
def test_dates_as_django_writes_them(world: World, root_client: Client, language, zone) -> None:
    """Dates written from the language's DATETIME_FORMAT split once a page (toolhub.formats'
    "Y-m-d H:i:s"), or by Django's dateformat for other specifiers (German's "j. F Y"),
    in the current time zone (+05:45 here)."""
    response = root_client.get(changelist(InvocationRecord))
    cl = response.context["cl"]
    with translation.override(language), timezone.override(zone):
        fast = rows(cl, fast_list.results)
        assert fast == rows(cl, admin_list.results)
    record = InvocationRecord.objects.order_by("-created_at", "-id").first()
    assert record is not None
    local = timezone.localtime(record.created_at, ZoneInfo(zone))
    shown = fast[0][1][1]
    assert local.strftime("%H:%M") in shown
    if language == "en-us":
        assert local.strftime("%Y-%m-%d %H:%M:%S") in shown


def test_a_tenant_staff_members_lists_have_djangos_rows(world: World, staff_client: Client) -> None:
    """Scoped to their tenants."""
    for model in (Tool, InvocationRecord):
        assert same_rows(staff_client, changelist(model))


def test_an_editable_list_has_djangos_rows(
    world: World, root_client: Client, odd_tool, editable_tools
) -> None:
    path = changelist(Tool)
    assert same_rows(root_client, path)
    same_rows(root_client, path + "?o=-1&q=a")


def test_each_kind_of_cell(world: World, root_client: Client, odd_tool, editable_tools) -> None:
    """What the old renderer wrote for each kind of cell, spelled out."""
    page = root_client.get("/admin/tools/tool/?q=odd").content.decode()
    quoted = "odd_5F_5Fa%20b_2F%C3%BC_22_3Cx_3E_26'(1)_25"
    # The first column links to the row (th); the row's checkbox; a boolean; a choice.
    assert (
        f'<th class="field-id"><a href="/admin/tools/tool/{quoted.replace("'", "&#x27;")}/change/'
        '?_changelist_filters=q%3Dodd">odd__a b/ü&quot;&lt;x&gt;&amp;&#x27;(1)%</a></th>'
    ) in page
    odd = "odd__a b/ü&quot;&lt;x&gt;&amp;&#x27;(1)%"
    checkbox = (
        f'<input type="checkbox" name="_selected_action" value="{odd}" class="action-select" '
        f'aria-label="Select this object for an action - {odd}">'
    )
    assert f'<td class="action-checkbox">{checkbox}</td>' in page
    tools = admin.site._registry[Tool]
    assert checkbox == tools.action_checkbox(odd_tool)
    assert checkbox == admin.ModelAdmin.action_checkbox(tools, odd_tool)  # Django's
    yes = static("admin/img/icon-yes.svg")
    assert f'<td class="field-requires_confirmation"><img src="{yes}" alt="True"></td>' in page
    assert '<td class="field-effect">' in page
    # list_editable: the row's input (unchecked), its hidden id after the table.
    assert (
        '<td class="field-enabled"><input type="checkbox" name="form-0-enabled" '
        'aria-describedby="id_form-0-enabled_helptext" id="id_form-0-enabled"></td>'
    ) in page
    assert '<input type="hidden" name="form-0-id" value="odd__a b/ü&quot;' in page

    record = InvocationRecord.objects.filter(error_code="").first()
    assert record is not None
    page = root_client.get("/admin/invocations/invocationrecord/").content.decode()
    # An empty value; a display method (the run's link); a foreign key; a date.
    assert '<td class="field-error_code">-</td>' in page
    assert f'<td class="field-run_link"><a href="/console/runs/{record.run_id}/?tenant=' in page
    assert f'<td class="field-tenant nowrap">{record.tenant}</td>' in page
    assert (
        '<th class="field-created_at nowrap"><a href="/admin/invocations/invocationrecord/' in page
    )


def test_sorting_by_a_column_still_works(world: World, root_client: Client, odd_tool) -> None:
    index = 1 + ToolAdmin.list_display.index("id")  # after the checkbox column
    ids = {}
    for order in (str(index), f"-{index}"):
        cells = same_rows(root_client, f"/admin/tools/tool/?o={order}")
        ids[order] = [row[1].split(">", 2)[2].split("<", 1)[0] for row in cells]
    assert ids[str(index)] == sorted(ids[str(index)])
    assert ids[f"-{index}"] == ids[str(index)][::-1]


@pytest.fixture
def many_tools(world: World) -> None:
    """Two pages of tools."""
    template = Tool.objects.get(pk=TOOL)
    for i in range(120):
        template.pk = f"bulk__tool_{i:03}"
        template.save(force_insert=True)


def test_a_page_past_the_end_goes_back_to_the_list(root_client: Client, many_tools) -> None:
    assert len(same_rows(root_client, "/admin/tools/tool/?p=2")) > 20
    response = root_client.get("/admin/tools/tool/?p=3")
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


def test_the_tools_page_takes_as_many_queries_with_more_rows(
    root_client: Client, many_tools
) -> None:
    """As the history lists (test_list_plans): no query per row."""
    counts = queries_per_page_size(root_client, "/admin/tools/tool/", ToolAdmin)
    assert counts[0] == counts[1], counts


def test_lean_lists_read_no_json_column(world: World, root_client: Client) -> None:
    """Records, events, approvals and tools are listed without their JSON columns (and
    the approvals without their tools' schemas): none is shown, and a page of a hundred
    records decoded a hundred arguments and results only to drop them."""
    from django.db import connection
    from django.db.models import JSONField
    from django.test.utils import CaptureQueriesContext

    from apps.approvals.models import ApprovalRequest
    from apps.invocations.models import RunEvent

    def json_columns(model: Any) -> list[str]:
        table = model._meta.db_table
        return [
            f'"{table}"."{field.column}"'
            for field in model._meta.concrete_fields
            if isinstance(field, JSONField)
        ]

    for model in (InvocationRecord, RunEvent, ApprovalRequest, Tool):
        assert getattr(admin.site._registry[model], "lean_list", False)
        table = model._meta.db_table
        with CaptureQueriesContext(connection) as queries:
            assert root_client.get(changelist(model)).status_code == 200
        [page] = [
            q["sql"] for q in queries.captured_queries if q["sql"].startswith(f'SELECT "{table}"."')
        ]
        unread = json_columns(model) + (json_columns(Tool) if model is ApprovalRequest else [])
        assert unread and not [column for column in unread if column in page], page
        if model is ApprovalRequest:
            assert '"tools_tool"."id"' in page  # the tool is still joined, for its name
