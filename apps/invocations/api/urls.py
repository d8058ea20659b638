from django.urls import path

from apps.invocations.api import idempotency, runs, simulations, streams, views, wire_views

urlpatterns = [
    path("invocations/", views.InvocationListView.as_view(), name="invocation-list"),
    path(
        "invocations/<uuid:invocation_id>/",
        views.InvocationDetailView.as_view(),
        name="invocation-detail",
    ),
    path(
        "invocations/<uuid:invocation_id>/cancel/",
        views.InvocationCancelView.as_view(),
        name="invocation-cancel",
    ),
    path("runs/", runs.RunListView.as_view(), name="run-list"),
    path("simulations/", simulations.SimulationView.as_view(), name="simulation"),
    path(
        "idempotency-keys/invalidate/",
        idempotency.InvalidationView.as_view(),
        name="idempotency-invalidate",
    ),
    path("stream-tickets/", streams.StreamTicketView.as_view(), name="stream-ticket"),
    path(
        "wire/openai/tool-calls/",
        wire_views.OpenAIToolCallsView.as_view(),
        name="wire-openai-tool-calls",
    ),
    path(
        "wire/anthropic/tool-use/",
        wire_views.AnthropicToolUseView.as_view(),
        name="wire-anthropic-tool-use",
    ),
]
