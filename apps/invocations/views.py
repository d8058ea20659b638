"""The demo chat page: a run's events rendered live, the thing a frontend would copy."""

from __future__ import annotations

import uuid

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.tools.permissions import executable_tools


@staff_member_required
@ensure_csrf_cookie
def demo_chat(request: HttpRequest) -> HttpResponse:
    run_id = request.GET.get("run") or f"run_{uuid.uuid4().hex[:12]}"
    tools = executable_tools(request.user).values_list("pk", flat=True)  # type: ignore[arg-type]
    return render(request, "streams/demo_chat.html", {"run_id": run_id, "tools": list(tools)})
