"""The callback endpoint's route, ``processor/``, for a host project's URLconf: the URL to give the
processor."""

from django.urls import path

from callbacks.apis import processor_callback

app_name = "callbacks"

urlpatterns = [
    path("processor/", processor_callback, name="processor"),
]
