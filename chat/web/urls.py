from __future__ import annotations

from django.urls import path

import cachet.converters  # noqa: F401  (registers the ``id`` converter)
from chat.web import attachments, session_settings, shares, sidebar, tokens, transfer, usage, views

urlpatterns = [
    path("", views.home, name="home"),
    path("settings/theme", views.theme_view, name="theme"),
    path("usage/", usage.usage_page, name="usage"),
    path("usage.csv", usage.usage_csv, name="usage_csv"),
    path("tokens/", tokens.api_tokens_page, name="api_tokens"),
    path("tokens/<id:token_id>/revoke", tokens.api_token_revoke_view, name="api_token_revoke"),
    path("sessions/new", views.session_new, name="session_new"),
    path("sessions/sidebar", sidebar.sidebar_view, name="sidebar"),
    path("sessions/import", transfer.import_session, name="session_import"),
    path("sessions/<id:session_id>/", views.session_page, name="session"),
    path("sessions/<id:session_id>/rename", views.session_rename_view, name="session_rename"),
    path("sessions/<id:session_id>/delete", views.session_delete_view, name="session_delete"),
    path("sessions/<id:session_id>/pin", views.session_pin_view, name="session_pin"),
    path("sessions/<id:session_id>/archive", views.session_archive_view, name="session_archive"),
    path("sessions/<id:session_id>/export.md", transfer.export_markdown, name="session_export_markdown"),
    path("sessions/<id:session_id>/export.json", transfer.export_json, name="session_export_json"),
    path("sessions/<id:session_id>/chart", views.session_chart, name="session_chart"),
    path("sessions/<id:session_id>/models", views.session_models, name="session_models"),
    path("sessions/<id:session_id>/turns/", views.session_turns, name="session_turns"),
    path("sessions/<id:session_id>/turns/<id:number>/", views.session_turn, name="session_turn"),
    path("sessions/<id:session_id>/turns/<id:number>/source", views.session_turn_source, name="session_turn_source"),
    path("sessions/<id:session_id>/turns/<id:number>/rating", views.turn_rating_view, name="turn_rating"),
    path("sessions/<id:session_id>/results/<id:number>/", views.result_page, name="result"),
    path("sessions/<id:session_id>/attach", attachments.attach_view, name="session_attach"),
    path(
        "sessions/<id:session_id>/attachments/<id:upload_id>/remove",
        attachments.attachment_remove_view,
        name="session_attachment_remove",
    ),
    path("sessions/<id:session_id>/settings", session_settings.session_settings_view, name="session_settings"),
    path("sessions/<id:session_id>/share", shares.share_start_view, name="session_share"),
    path("sessions/<id:session_id>/share/stop", shares.share_stop_view, name="session_share_stop"),
    path("shared/<slug:token>/", shares.shared_page, name="shared"),
    path("shared/<slug:token>/turns/", shares.shared_turns, name="shared_turns"),
    path("shared/<slug:token>/copy", shares.shared_copy, name="shared_copy"),
]
