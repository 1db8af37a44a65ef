"""``ENGINE = "cachet.embedded_backend"``: Django's ``postgresql`` backend whose connections go to the
embedded Postgres of ``DATABASES[...]["CACHET_DATA"]``, started on the first connection, not at import."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.db.backends.postgresql import base, client

from cachet.embedded_pg import EmbeddedServer, embedded_server, psql_path


def _server(settings_dict: dict[str, Any], *, check: bool = True) -> EmbeddedServer:
    return embedded_server(Path(settings_dict["CACHET_DATA"]), check=check)


class DatabaseClient(client.DatabaseClient):
    """``manage.py dbshell``: the ``psql`` that ships with the embedded Postgres, on its socket."""

    @classmethod
    def settings_to_cmd_args_env(
        cls, settings_dict: dict[str, Any], parameters: Iterable[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        server = _server(settings_dict)
        located = {**settings_dict, "HOST": server.host, "PORT": server.port, "USER": server.user}
        args, env = super().settings_to_cmd_args_env(located, parameters)
        return [str(psql_path()), *args[1:]], env


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def _located(self, *, check: bool) -> EmbeddedServer:
        try:
            return _server(self.settings_dict, check=check)
        except self.Database.Error:
            raise
        except Exception as error:  # initdb or pg_ctl failed; the log in the data folder says why
            raise self.Database.OperationalError(f"the embedded Postgres did not start: {error!r}") from error

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        server = self._located(check=False)
        params.update(host=server.host, port=server.port, user=server.user)
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        """Connect; when that fails, start the server again should it have stopped, and try once more."""
        try:
            return super().get_new_connection(conn_params)
        except self.Database.OperationalError:
            server = self._located(check=True)
            return super().get_new_connection({**conn_params, "host": server.host, "port": server.port})
