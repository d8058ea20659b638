from django.urls import path

from apps.invocations.api import streams, views

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
    path("stream-tickets/", streams.StreamTicketView.as_view(), name="stream-ticket"),
]
