"""The demo chat page (a run's events rendered live, the thing a frontend would copy) and
the staff's run timeline and overview charts."""

from __future__ import annotations

import uuid

from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.invocations import stats
from apps.invocations.models import InvocationRecord, Run, RunEvent
from apps.invocations.streams import is_run_id
from apps.tenants.callers import Caller, NoTenant
from apps.tenants.models import Tenant
from apps.tenants.scoping import staff_tenants
from apps.tools.permissions import executable_tools
from apps.tools.schema import example_arguments


@staff_member_required
@ensure_csrf_cookie
def demo_chat(request: HttpRequest) -> HttpResponse:
    """A staff member of several tenants picks one first (`?tenant=<slug>`): the page
    then names it on the stream (`?tenant=`) and on every call (X-Toolhub-Tenant),
    which would otherwise be refused as ambiguous (4403, 403)."""
    run_id = request.GET.get("run") or f"run_{uuid.uuid4().hex[:12]}"
    chosen = request.GET.get("tenant") or None
    try:
        caller = Caller.for_user(request.user, chosen)  # type: ignore[arg-type]
    except NoTenant as exc:
        user = request.user
        tenants = (
            Tenant.objects.all() if user.is_superuser else Tenant.objects.filter(members=user.pk)
        )
        return render(
            request,
            "streams/demo_chat_tenants.html",
            {"run_id": run_id, "tenants": tenants, "problem": str(exc) if chosen else ""},
        )
    tools = executable_tools(request.user).values_list("pk", "input_schema")  # type: ignore[arg-type]
    templates = {tool_id: example_arguments(schema) or {} for tool_id, schema in tools}
    return render(
        request,
        "streams/demo_chat.html",
        {
            "run_id": run_id,
            "tools": list(templates),
            "templates": templates,
            "tenant": caller.tenant,
        },
    )


@staff_member_required
def run_timeline(request: HttpRequest, run_id: str) -> HttpResponse:
    """One run's events in order, with its records, then live from the run stream.

    A run id is unique per tenant: staff of several tenants name one (`?tenant=`) when
    the id exists in more than one of theirs, as the stream itself requires.
    """
    if not is_run_id(run_id):
        raise Http404("Not a run id.")
    tenants = staff_tenants(request.user)
    chosen = request.GET.get("tenant")
    if chosen:
        tenants = tenants.filter(slug=chosen)
    holding = list(
        tenants.filter(
            Q(pk__in=Run.objects.filter(run_id=run_id).values("tenant"))
            | Q(pk__in=InvocationRecord.objects.filter(run_id=run_id).values("tenant"))
        )[:20]
    )
    if not holding:
        raise Http404("No such run in your tenants.")
    if len(holding) > 1:
        return render(
            request, "invocations/run_tenants.html", {"run_id": run_id, "tenants": holding}
        )
    tenant = holding[0]
    events = list(RunEvent.objects.filter(tenant=tenant, run_id=run_id).order_by("seq"))
    records = (
        InvocationRecord.objects.filter(tenant=tenant, run_id=run_id)
        .select_related("approval")
        .order_by("created_at")
    )
    context = {
        "run_id": run_id,
        "tenant": tenant,
        "events": events,
        "records": records,
        "last_seq": events[-1].seq if events else 0,
    }
    return render(request, "invocations/run_timeline.html", context)


OVERVIEW_MINUTES = 30


@staff_member_required
def overview(request: HttpRequest) -> HttpResponse:
    """Charts of the staff member's tenants (superusers: all), redrawn from `overview_data`."""
    return render(request, "invocations/overview.html", {"minutes": OVERVIEW_MINUTES})


@staff_member_required
def overview_data(request: HttpRequest) -> JsonResponse:
    """The overview's numbers (`apps.invocations.stats.overview`), polled by the page."""
    tenants = staff_tenants(request.user)
    chosen = request.GET.get("tenant")
    if chosen:
        tenants = tenants.filter(slug=chosen)
    response = JsonResponse(stats.overview(tenants, OVERVIEW_MINUTES))
    response["Cache-Control"] = "no-store"
    return response
