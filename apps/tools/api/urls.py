from django.urls import path

from apps.tools.api import views

urlpatterns = [path("tools/", views.ToolCatalogView.as_view(), name="tool-catalog")]
