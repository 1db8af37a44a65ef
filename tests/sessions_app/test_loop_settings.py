"""The loop's settings are one typed value built from loop.json's ``loop`` section: every key read, none invented."""

from __future__ import annotations

from dataclasses import fields

import pytest

from sessions_app import prompts
from sessions_app.prompts import LoopSettings, loop_settings_of


def test_every_key_of_the_loop_section_is_a_typed_setting() -> None:
    loop = prompts.loop_json()["loop"]
    settings = prompts.loop_settings()
    assert [field.name for field in fields(LoopSettings)] == list(loop)
    for field in fields(LoopSettings):
        value = getattr(settings, field.name)
        assert type(value).__name__ == field.type, field.name
        assert value == loop[field.name]
    assert prompts.loop_settings() is settings, "built once per version of loop.json"


def test_a_loop_section_that_lacks_a_setting_is_refused_naming_it() -> None:
    loop = dict(prompts.loop_json()["loop"])
    del loop["max_steps"]
    with pytest.raises(KeyError, match="max_steps"):
        loop_settings_of(loop)
