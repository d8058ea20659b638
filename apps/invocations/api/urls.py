from django.urls import path

from apps.invocations.api import views

urlpatterns = [
    path("invocations/", views.InvocationListView.as_view(), name="invocation-list"),
    path(
        "invocations/<uuid:invocation_id>/",
        views.InvocationDetailView.as_view(),
        name="invocation-detail",
    ),
]
