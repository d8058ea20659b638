"""The operator console: a live queue, a detail page to decide, and the history."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from apps.approvals import decisions, history_paging
from apps.approvals.forms import BulkDecisionForm, DecisionForm
from apps.approvals.models import ApprovalRequest, ApprovalStatus


def _pending(request: HttpRequest) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.decidable_by(request.user).pending().order_by("created_at"))


@staff_member_required
def queue(request: HttpRequest) -> HttpResponse:
    return render(request, "approvals/queue.html", {"approvals": _pending(request)})


@staff_member_required
def queue_rows(request: HttpRequest) -> HttpResponse:
    """The queue's rows alone, for the page's live refresh; the count rides in a header
    so the page title can follow it."""
    approvals = _pending(request)
    response = render(request, "approvals/_rows.html", {"approvals": approvals})
    response[PENDING_COUNT_HEADER] = str(len(approvals))
    return response


PENDING_COUNT_HEADER = "X-Pending-Count"


@staff_member_required
@require_http_methods(["POST"])
def bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject the calls ticked in the queue; what happened to each is flashed
    back on the queue."""
    form = BulkDecisionForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, str(error))
        return redirect("console:queue")
    try:
        results = decisions.decide_many(
            form.cleaned_data["ids"],
            request.user,  # type: ignore[arg-type]
            form.cleaned_data["action"],
            form.cleaned_data["reason"],
        )
    except decisions.DecisionError as exc:
        messages.error(request, str(exc))
        return redirect("console:queue")
    done = [result for result in results if result.done]
    if done:
        messages.success(
            request,
            f"{len(done)} of {len(results)} decided: "
            + "; ".join(f"{r.tool_id} {r.outcome}" for r in done),
        )
    for result in results:
        if not result.done:
            messages.warning(request, f"{result.tool_id or result.approval_id}: {result.outcome}")
    return redirect("console:queue")


@staff_member_required
@require_http_methods(["GET", "POST"])
def detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    decisions.expire_if_overdue_safely(approval_id)
    approval = ApprovalRequest.objects.decidable_by(request.user).filter(pk=approval_id).first()
    if approval is None:
        return _missing(request, approval_id)
    form = DecisionForm(
        request.POST or None,
        initial={"args": json.dumps(approval.args, indent=2, ensure_ascii=False)},
    )
    if request.method == "POST" and form.is_valid():
        action = form.cleaned_data["action"]
        try:
            decisions.decide(
                approval.pk,
                request.user,  # type: ignore[arg-type]
                "reject" if action == "reject" else "approve",
                form.cleaned_data.get("reason", ""),
                form.cleaned_data.get("edited") if action == "edit" else None,
            )
        except decisions.InvalidEdit as exc:
            # Re-render, not redirect: the operator's edited text stays in the form.
            form.add_error("args" if action == "edit" else None, str(exc))
            return _render_detail(request, approval, form, status=400)
        except decisions.DecisionError as exc:
            messages.error(request, str(exc))
            return redirect("console:detail", approval_id=approval.pk)
        verb = {"approve": "Approved", "edit": "Approved with edits", "reject": "Rejected"}[action]
        messages.success(request, f"{verb}: {approval.tool_id} for {approval.principal}.")
        return redirect("console:queue")
    return _render_detail(request, approval, form)


def _render_detail(
    request: HttpRequest, approval: ApprovalRequest, form: DecisionForm, status: int = 200
) -> HttpResponse:
    context = {
        "approval": approval,
        "form": form,
        "decided": approval.status != ApprovalStatus.PENDING,
        "votes": approval.votes.select_related("user"),
        "record": approval.invocation,
        "outcome_final": approval.status in FINAL,
    }
    return render(request, "approvals/detail.html", context, status=status)


# Once an approval is in one of these, its call's outcome will not change any more.
FINAL = {
    ApprovalStatus.SUCCEEDED,
    ApprovalStatus.FAILED,
    ApprovalStatus.REJECTED,
    ApprovalStatus.EXPIRED,
    ApprovalStatus.CANCELLED,
}


def _missing(request: HttpRequest, approval_id: str) -> HttpResponse:
    """410 for a request that retention pruned (apps/retention/gone.py), else 404."""
    from django.http import HttpResponseGone

    from apps.retention import gone

    body = gone.approval(approval_id, request.user)
    if body is None:
        raise Http404("No such approval request that you may decide.")
    return HttpResponseGone(body["detail"], content_type="text/plain; charset=utf-8")


@staff_member_required
def outcome(request: HttpRequest, approval_id: str) -> HttpResponse:
    """The call's outcome alone, which the detail page re-fetches until it is final."""
    approval = (
        ApprovalRequest.objects.decidable_by(request.user)
        .select_related("invocation")
        .filter(pk=approval_id)
        .first()
    )
    if approval is None:
        return _missing(request, approval_id)
    context = {
        "approval": approval,
        "record": approval.invocation,
        "outcome_final": approval.status in FINAL,
    }
    return render(request, "approvals/_outcome.html", context)


HISTORY_PAGE = 50


@staff_member_required
def history(request: HttpRequest) -> HttpResponse:
    """Decided approvals, newest request first, paged by keyset (`?before=<cursor>`): no
    page counts anything, and a deep page costs what the first does."""
    approvals = ApprovalRequest.objects.decidable_by(request.user).exclude(
        status=ApprovalStatus.PENDING
    )
    query = request.GET.get("q", "").strip()
    if query:
        approvals = approvals.filter(
            Q(tool__id__icontains=query)
            | Q(principal__icontains=query)
            | Q(decision_reason__icontains=query)
            | Q(run_id__icontains=query)
            | Q(decided_by__username__icontains=query)
        )
    wanted = request.GET.get("status", "")
    if wanted in ApprovalStatus.values:
        approvals = approvals.filter(status=wanted)
    before = request.GET.get("before", "")
    if before:
        position = history_paging.decode(before)
        if position is None:
            return HttpResponseBadRequest(
                "Invalid 'before': use the Older link as it is, or start from the newest."
            )
        approvals = approvals.filter(history_paging.older_than(*position))
    rows = list(approvals.order_by("-created_at", "-id")[: HISTORY_PAGE + 1])
    older = history_paging.encode(rows[HISTORY_PAGE - 1]) if len(rows) > HISTORY_PAGE else ""
    return render(
        request,
        "approvals/history.html",
        {
            "approvals": rows[:HISTORY_PAGE],
            "older": older,
            "paged": bool(before),
            "q": query,
            "status": wanted,
            "statuses": ApprovalStatus.values,
        },
    )
