"""The ``id`` path converter: 1 to 2**63-1, written without a leading zero; anything else matches no route."""

from __future__ import annotations

import pytest
from django.urls import Resolver404, resolve, reverse

from cachet.converters import MAX_ID, IdConverter


@pytest.mark.parametrize("text", ["1", "42", str(MAX_ID)])
def test_ids_in_range_resolve(text: str) -> None:
    match = resolve(f"/sessions/{text}/results/{text}/")
    assert match.kwargs == {"session_id": int(text), "number": int(text)}
    assert reverse("session", kwargs={"session_id": int(text)}) == f"/sessions/{text}/"


@pytest.mark.parametrize("text", ["0", "007", "-1", "abc", "1.5", str(MAX_ID + 1), "9" * 20, "٣"])
def test_anything_else_is_no_route(text: str) -> None:
    with pytest.raises(Resolver404):
        resolve(f"/sessions/{text}/")


def test_to_python_refuses_past_bigint() -> None:
    converter = IdConverter()
    assert converter.to_python(str(MAX_ID)) == MAX_ID
    with pytest.raises(ValueError):
        converter.to_python(str(MAX_ID + 1))
