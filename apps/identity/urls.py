from django.urls import path

from apps.identity import views

# The names are mozilla-django-oidc's (its session check reverses them).
urlpatterns = [
    path("authenticate/", views.SignInStart.as_view(), name="oidc_authentication_init"),
    path("callback/", views.SignInCallback.as_view(), name="oidc_authentication_callback"),
    path("logout/", views.logout, name="oidc_logout"),
]
