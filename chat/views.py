"""The pages a person uses."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from sessions_app.selectors.sessions import session_list


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "chat/home.html", {"sessions": session_list(owner=request.user)})
