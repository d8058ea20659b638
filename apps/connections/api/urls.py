from django.urls import path

from apps.connections.api import views

urlpatterns = [path("connections/", views.ConnectionListView.as_view(), name="connection-list")]
