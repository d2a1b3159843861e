"""The project's own templates (``templates/``): admin branding, error pages that leak nothing."""

import pytest
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.test import Client
from django.urls import include, path

SECRET = "secret-detail-7f3a"


def _server_error(request):
    raise RuntimeError(f"database password is {SECRET}")


def _forbidden(request):
    raise PermissionDenied(f"only {SECRET} may")


def _bad_request(request):
    raise SuspiciousOperation(f"bad header {SECRET}")


# This module is the URLconf of the error-page tests: the project's URLs plus views that fail.
urlpatterns = [
    path("boom/", _server_error),
    path("forbidden/", _forbidden),
    path("bad/", _bad_request),
    path("", include("config.urls")),
]


@pytest.fixture
def production_client(settings) -> Client:
    """A client that gets the error page, as a browser would, with DEBUG off."""
    settings.DEBUG = False
    return Client(raise_request_exception=False)


@pytest.mark.django_db
def test_an_unknown_address_gets_the_projects_404_page_without_the_path(production_client):
    response = production_client.get(f"/no-such-page-{SECRET}/")

    assert response.status_code == 404
    assert "404.html" in [t.name for t in response.templates]
    assert b"<h1>Not found</h1>" in response.content
    assert SECRET.encode() not in response.content


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    "url, status, template, heading",
    [
        ("/boom/", 500, "500.html", b"<h1>Server error</h1>"),
        ("/forbidden/", 403, "403.html", b"<h1>Forbidden</h1>"),
        ("/bad/", 400, "400.html", b"<h1>Bad request</h1>"),
    ],
)
def test_a_failing_view_gets_the_projects_error_page_without_the_exception(
    production_client, url, status, template, heading
):
    response = production_client.get(url)

    assert response.status_code == status
    assert template in [t.name for t in response.templates]
    assert heading in response.content
    assert SECRET.encode() not in response.content


@pytest.mark.django_db
def test_the_admin_shows_the_projects_branding(admin_client):
    response = admin_client.get("/admin/")

    assert response.status_code == 200
    page = response.content.decode()
    assert '<div id="site-name"><a href="/admin/">ACH payments operations</a></div>' in page
    assert "<title>Site administration | ACH payments admin</title>" in page
    assert "Django administration" not in page
