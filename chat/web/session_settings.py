"""A session's Settings menu: its instructions (typed, or a preset of the person's), temperature and max tokens,
and the person's presets (save the instructions as one, delete one)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from chat.web.forms import SessionSettingsChangeForm
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_get
from sessions_app.selectors.settings import preset_get
from sessions_app.services.sessions import preset_delete, preset_save, session_settings_set


def settings_fragment(
    request: HttpRequest,
    session: ChatSession,
    *,
    form: SessionSettingsChangeForm | None = None,
    said: str = "",
    error: str = "",
) -> HttpResponse:
    form = form or SessionSettingsChangeForm(session=session)
    context = {"session": session, "settings_form": form, "settings_said": said, "settings_error": error}
    return render(request, "chat/_session_settings.html", context)


@login_required
@require_POST
def session_settings_view(request: HttpRequest, session_id: int) -> HttpResponse:
    """Save the settings (``action=save``), keep the instructions as a preset (``save_preset``) or delete the
    chosen preset (``delete_preset``); the menu comes back saying what was done."""
    session = session_get(owner=request.user, session_id=session_id)
    if session is None:
        raise Http404("No such session.")
    form = SessionSettingsChangeForm(request.POST, session=session)
    if not form.is_valid():
        return settings_fragment(request, session, form=form, error="Nothing was saved: see below.")
    action = request.POST.get("action", "save")
    data = form.cleaned_data
    shown = request.POST.copy()  # the box as it was typed, for the actions that save nothing of the session
    try:
        if action == "save_preset":
            preset = preset_save(owner=session.owner, name=data["preset_name"], text=form.chosen_instructions())
            said = f"Kept as the preset “{preset.name}”."
            shown["preset"] = str(preset.pk)  # the list shows the preset just kept, not "—"
        elif action == "delete_preset":
            chosen = preset_get(owner=request.user, preset_id=data["preset"]) if data["preset"] else None
            if chosen is None:
                return settings_fragment(request, session, error="Choose a preset of your own to delete.")
            preset_delete(preset=chosen)
            said = f"Deleted the preset “{chosen.name}”."
        else:
            session = session_settings_set(
                session=session,
                instructions=form.chosen_instructions(),
                temperature=data["temperature"],
                max_tokens=data["max_tokens"],
            )
            said = "Saved: they apply from your next message."
    except ValueError as error:
        return settings_fragment(request, session, form=form, error=str(error))
    if not request.headers.get("HX-Request"):
        return redirect("session", session_id=session.pk)
    if action == "save":
        return settings_fragment(request, session, said=said)
    # the box keeps what was typed, not saved yet; the presets are read again
    return settings_fragment(request, session, form=SessionSettingsChangeForm(shown, session=session), said=said)
