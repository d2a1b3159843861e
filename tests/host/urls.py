"""The host's URLconf: its own pages, and the module mounted under /ach/."""

from django.contrib import admin
from django.urls import include, path

from tests.host.shop.views import WhoAmI

urlpatterns = [
    path("backoffice/", admin.site.urls),
    # The host's own API is versioned in its path (URLPathVersioning); the module's is not.
    path("shop/<str:version>/whoami/", WhoAmI.as_view()),
    path("ach/api/", include("payments.urls")),
    path("ach/api/", include("bank.urls")),
    path("ach/callbacks/", include("callbacks.urls")),
    path("ach/", include("triage.urls")),
]
