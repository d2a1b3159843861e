from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from triage import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/", include("payments.urls")),
    path("callbacks/", include("callbacks.urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]
