"""A URL configuration for the error page tests: Cachet's own, plus views that fail on purpose."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import path

from cachet.urls import urlpatterns as cachet_urlpatterns


def broken(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a view failed on purpose")


def forbidden(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied("not for you")


urlpatterns = [
    path("test-only/broken/", broken),
    path("test-only/forbidden/", forbidden),
    *cachet_urlpatterns,
]
