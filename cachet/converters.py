"""The ``id`` path converter: a database id, 1 to 2**63-1 with no leading zero, so that no URL can carry a
number Postgres refuses (a bigint) and every id outside the range is simply not found."""

from __future__ import annotations

from django.urls import register_converter

MAX_ID = 2**63 - 1


class IdConverter:
    regex = "[1-9][0-9]{0,18}"

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > MAX_ID:
            raise ValueError(f"{value} is past the largest id")
        return number

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")
