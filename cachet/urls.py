from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from cachet.directory.oidc import OidcCallback, OidcLogin
from cachet.directory.views import LoginView
from chat.api.routes import api
from chat.api.routes import index as api_index
from chat.api.routes import not_found as api_not_found
from chat.web.metrics import metrics_view

handler500 = "cachet.outage.server_error"

urlpatterns = [
    path("favicon.ico", RedirectView.as_view(url=static("cachet/favicon.svg"), permanent=True), name="favicon"),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", api_index, name="api_index"),
    path("api/v1/", api.urls),
    re_path(r"^api/(?P<rest>.*)$", api_not_found),
    path("login/", LoginView.as_view(), name="login"),
    path("oidc/login/", OidcLogin.as_view(), name="oidc_login"),
    path("oidc/callback/", OidcCallback.as_view(), name="oidc_callback"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password/",
        auth_views.PasswordChangeView.as_view(template_name="account/password_change.html"),
        name="password_change",
    ),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="account/password_change_done.html"),
        name="password_change_done",
    ),
    path("", include("chat.web.urls")),
]
