from django.urls import path

from apps.approvals import views

app_name = "console"
urlpatterns = [
    path("", views.queue, name="queue"),
    path("queue/rows/", views.queue_rows, name="queue-rows"),
    path("approvals/<uuid:approval_id>/", views.detail, name="detail"),
    path("history/", views.history, name="history"),
]
