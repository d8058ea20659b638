from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.identity import views as identity_views
from apps.identity.forms import LoginForm
from apps.invocations import views as invocation_views
from apps.receipts import views as receipt_views
from toolhub.apidocs import websocket_docs
from toolhub.ops import health, metrics

handler404 = "toolhub.web.api.json_not_found"
handler500 = "toolhub.web.api.json_server_error"

# The admin says whose it is (Django's default is "Django administration").
admin.site.site_header = "toolhub admin"
admin.site.site_title = "toolhub admin"
admin.site.index_title = "Tenants, tools, policies and records"
# The password login, refusing non-superusers when TOOLHUB_PASSWORD_LOGIN=0 (apps/identity).
admin.site.login_form = LoginForm

api_v1: list[URLPattern | URLResolver] = [
    path("", include("apps.tools.api.urls")),
    path("", include("apps.invocations.api.urls")),
    path("", include("apps.approvals.api.urls")),
    path("", include("apps.connections.api.urls")),
    path("", include("apps.receipts.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
]

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    # Before the admin's own: a provider's user signs out at the provider too.
    path("admin/logout/", identity_views.logout),
    path("admin/", admin.site.urls),
    path("oidc/", include("apps.identity.urls")),
    path("console/", include("apps.approvals.urls")),
    path("demo/chat/", invocation_views.demo_chat, name="demo-chat"),
    path("api/v1/", include(api_v1)),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/docs/websockets/", websocket_docs.websocket_protocol, name="api-websockets"),
    path("api/docs/asyncapi.yaml", websocket_docs.asyncapi_yaml, name="api-asyncapi"),
    path(".well-known/", include("apps.oauth.urls")),
    path("oauth/", include("apps.oauth.server_urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path(".well-known/jwks.json", receipt_views.jwks, name="receipt-jwks"),
]
