"""Rows written in one statement, for the writes between a model's answer and the next request.

There each round trip to Postgres is time the model server waits: a step, its results and the next
request's record are written by statements that each do what a transaction of several did (atomic by
themselves), with the insert built once per model from Django's own fields, so defaults, ``auto_now_add``
and JSON are written as ``Model.objects.create`` writes them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, models

M = TypeVar("M", bound=models.Model)


@dataclass(frozen=True)
class RowInsert:
    """``INSERT INTO table (columns) SELECT %s, …`` of a model's concrete fields but its key: a ``FROM`` after
    it inserts the row only where what it names has a row (one the same statement has just updated, say)."""

    sql: str
    fields: tuple[models.Field[object, object], ...]


@functools.cache
def row_insert(model: type[models.Model]) -> RowInsert:
    quote = connection.ops.quote_name
    fields = tuple(field for field in model._meta.concrete_fields if not field.primary_key)
    columns = ", ".join(quote(str(field.column)) for field in fields)
    values = ", ".join(["%s"] * len(fields))
    return RowInsert(f"INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT {values}", fields)


def row_values(instance: models.Model) -> list[Any]:
    """The values ``instance``'s insert writes, in :func:`row_insert`'s order (``auto_now_add`` set now)."""
    return [
        field.get_db_prep_save(field.pre_save(instance, True), connection)
        for field in row_insert(type(instance)).fields
    ]


def row_stored(instance: M, pk: int) -> M:
    """``instance`` as Django holds a row it has just inserted with key ``pk``."""
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = DEFAULT_DB_ALIAS
    return instance


def row_update(instance: models.Model, fields: Sequence[str], *, also: str = "") -> None:
    """Write ``fields`` of ``instance``'s row in one statement (``also``: an expression the statement selects
    as it returns, such as ``sessions_app.services.durability.WITHOUT_WAITING``)."""
    sql, values = row_update_sql(instance, fields)
    returning = f" RETURNING {also}" if also else ""
    with connection.cursor() as cursor:
        cursor.execute(sql + returning, values)


def row_update_sql(instance: models.Model, fields: Sequence[str]) -> tuple[str, list[Any]]:
    """The ``UPDATE`` of :func:`row_update` and its values, for a statement that goes on from it (``RETURNING``,
    or a ``WITH`` that uses the row it returns)."""
    meta = type(instance)._meta
    quote = connection.ops.quote_name
    written = [field for field in meta.concrete_fields if field.name in fields]
    if len(written) != len(set(fields)):
        unknown = sorted(set(fields) - {field.name for field in written})
        raise ValueError(f"{meta.label} has no concrete fields {unknown}")
    assignments = ", ".join(f"{quote(str(field.column))} = %s" for field in written)
    values = [field.get_db_prep_save(getattr(instance, field.attname), connection) for field in written]
    sql = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {quote(str(meta.pk.column))} = %s"
    return sql, [*values, instance.pk]
