from django.urls import path

from callbacks.apis import processor_callback

app_name = "callbacks"

urlpatterns = [
    path("processor/", processor_callback, name="processor"),
]
