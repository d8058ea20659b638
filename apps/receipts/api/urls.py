from django.urls import path

from apps.receipts.api import views

urlpatterns = [
    path(
        "invocations/<uuid:invocation_id>/receipt/",
        views.InvocationReceiptView.as_view(),
        name="invocation-receipt",
    ),
]
