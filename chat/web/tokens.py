"""API tokens: the page where a person makes personal access tokens for the API and revokes them. A token's
secret is shown once, on the page that answers its making (never redirected to, never cached); after that only
its first characters are."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from chat.web.forms import ApiTokenForm
from sessions_app.selectors.tokens import api_token_get, api_tokens_of
from sessions_app.services.tokens import MadeToken, api_token_create, api_token_revoke


def _user(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User), "login_required lets only users through"
    return user


def _made(request: HttpRequest, form: ApiTokenForm) -> MadeToken | None:
    if not form.is_valid():
        return None
    try:
        return api_token_create(
            owner=_user(request), name=form.cleaned_data["name"], access=form.cleaned_data["access"]
        )
    except ValueError as error:
        form.add_error("name", str(error))
        return None


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def api_tokens_page(request: HttpRequest) -> HttpResponse:
    """The person's tokens and the form to make one; a token just made is shown with its secret, this once."""
    made = None
    form = ApiTokenForm(request.POST if request.method == "POST" else None)
    if form.is_bound:
        made = _made(request, form)
        if made is not None:
            form = ApiTokenForm()
    context: dict[str, Any] = {
        "form": form,
        "made": made,
        "tokens": api_tokens_of(owner=request.user),
        "me_url": request.build_absolute_uri(reverse("api-v1:me")),
    }
    return render(request, "chat/tokens.html", context)


@login_required
@require_POST
def api_token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the person's tokens (another person's is one there is not) and go back to the list."""
    token = api_token_get(owner=request.user, token_id=token_id)
    if token is None:
        raise Http404("No such token.")
    api_token_revoke(token=token)
    return redirect("api_tokens")
