"""An import too large, in Chromium: Daphne answers 413 after the request's headers, before the file is read, and
the person reads why rather than a dropped connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from sessions_app.models import ChatSession
from tests.browser.browser_kit import Browser, World, in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)

MB = 1024 * 1024


def test_an_import_past_the_limit_is_refused_with_the_reason(
    browser: Browser, world: World, tmp_path: Path, settings: Any
) -> None:
    settings.CACHET_IMPORT_MAX_BYTES = MB
    large = tmp_path / "large.json"
    large.write_bytes(b" " * (3 * MB))
    page = browser.page("ada")
    page.goto(world.url + "/")
    page.get_by_text("Import", exact=True).first.click()
    page.set_input_files("#import-file", str(large))
    page.select_option("#import-workspace", label=world.workspace.name)
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Import").click()
    response = navigation.value
    assert response is not None and response.status == 413
    expect(page.locator("body")).to_have_text("Too large: an import is at most 1 MB.")
    assert in_thread(ChatSession.objects.count) == 0
    assert browser.errors == [
        "console: Failed to load resource: the server responded with a status of 413 (Content Too Large)"
    ]
    browser.errors.clear()  # the refusal's own
