from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/", include("payments.urls")),
    path("api/", include("bank.urls")),
    path("callbacks/", include("callbacks.urls")),
    # /healthz, /readyz and /metrics at the root, as a host mounts them under its own prefix.
    path("", include("triage.urls")),
]
