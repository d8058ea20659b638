from django.urls import path

from apps.approvals import views
from apps.invocations import views as invocation_views

app_name = "console"
urlpatterns = [
    path("", views.queue, name="queue"),
    path("queue/rows/", views.queue_rows, name="queue-rows"),
    path("queue/decide/", views.bulk, name="bulk"),
    path("approvals/<uuid:approval_id>/", views.detail, name="detail"),
    path("approvals/<uuid:approval_id>/outcome/", views.outcome, name="outcome"),
    path("runs/<str:run_id>/", invocation_views.run_timeline, name="run"),
    path("overview/", invocation_views.overview, name="overview"),
    path("overview/data/", invocation_views.overview_data, name="overview-data"),
    path("history/", views.history, name="history"),
]
