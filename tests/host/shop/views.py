from rest_framework.response import Response
from rest_framework.views import APIView


class WhoAmI(APIView):
    """A host view on the host's REST_FRAMEWORK defaults (IsAdminUser, the shop's key header,
    the version in its path)."""

    def get(self, request, version):
        return Response({"user": str(request.user), "version": request.version})
