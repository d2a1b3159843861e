"""The product's URLs plus the minimal baseline view; used by bench.settings only."""

from django.urls import path

from bench.minimal import MinimalCallbackView
from config.urls import urlpatterns as product_urlpatterns

MINIMAL_PATH = "/bench/minimal-callback/"

urlpatterns = [
    *product_urlpatterns,
    path(MINIMAL_PATH.lstrip("/"), MinimalCallbackView.as_view(), name="bench-minimal-callback"),
]
