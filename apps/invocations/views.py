"""The demo chat page: a run's events rendered live, the thing a frontend would copy."""

from __future__ import annotations

import uuid

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.tenants.callers import Caller, NoTenant
from apps.tenants.models import Tenant
from apps.tools.permissions import executable_tools


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
    tools = executable_tools(request.user).values_list("pk", flat=True)  # type: ignore[arg-type]
    return render(
        request,
        "streams/demo_chat.html",
        {"run_id": run_id, "tools": list(tools), "tenant": caller.tenant},
    )
