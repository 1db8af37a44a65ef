from __future__ import annotations

from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        from django.conf import settings

        from chat import tasks
        from chat.web import logins

        logins.connect()
        tasks.connect()
        if settings.CACHET_LDAP_URI:  # django-auth-ldap is installed only where LDAP is used
            from cachet.directory import ldap

            ldap.connect()
