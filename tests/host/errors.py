from rest_framework.response import Response


def shop_exception_handler(exc, context):
    """The host's own error format; the module's views must not answer with it."""
    return Response({"shop_error": str(exc)}, status=418)
