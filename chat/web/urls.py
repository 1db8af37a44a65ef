from __future__ import annotations

from django.urls import path

from chat.web import views

urlpatterns = [
    path("", views.home, name="home"),
    path("sessions/new", views.session_new, name="session_new"),
    path("sessions/<int:session_id>/", views.session_page, name="session"),
    path("sessions/<int:session_id>/rename", views.session_rename_view, name="session_rename"),
    path("sessions/<int:session_id>/delete", views.session_delete_view, name="session_delete"),
    path("sessions/<int:session_id>/chart", views.session_chart, name="session_chart"),
    path("sessions/<int:session_id>/turns/", views.session_turns, name="session_turns"),
    path("sessions/<int:session_id>/turns/<int:number>/", views.session_turn, name="session_turn"),
    path("sessions/<int:session_id>/results/<int:number>/", views.result_page, name="result"),
]
