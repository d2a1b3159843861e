"""The product's URLs plus the minimal baseline view and the Celery peer's callback view; used
by bench.settings only."""

from django.urls import path

from bench.minimal import MinimalCallbackView
from bench.peer.views import CeleryCallbackView
from config.urls import urlpatterns as product_urlpatterns

MINIMAL_PATH = "/bench/minimal-callback/"
PEER_PATH = "/bench/celery-callback/"

urlpatterns = [
    *product_urlpatterns,
    path(MINIMAL_PATH.lstrip("/"), MinimalCallbackView.as_view(), name="bench-minimal-callback"),
    path(PEER_PATH.lstrip("/"), CeleryCallbackView.as_view(), name="bench-celery-callback"),
]
