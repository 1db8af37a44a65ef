"""Finding and moving sessions in Chromium: Search sessions as one types, Export, Import."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from testing.scripted_server import Step
from tests.browser.browser_kit import Browser, World, screenshot
from tests.browser.test_browser_chat import send, start_session, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)


def chat(page: Any, url: str, words: str) -> int:
    page.goto(url + "/")
    session_id = start_session(page)
    send(page, words)
    expect(page.locator("#transcript article").last).to_have_attribute("data-status", "done")
    wait_idle(page)
    return session_id


def test_search_finds_a_session_by_a_word_from_the_middle_of_a_message(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Checked."), Step(text="Fine."), Step(text="Bob's answer."))
    page = browser.page("ada")
    wanted = chat(
        page,
        world.url,
        "Before we ship, look at the configuration loader and tell me why the quetzal flag is ignored at startup.",
    )
    other = chat(page, world.url, "Something else entirely.")
    theirs_page = browser.page("bob")
    theirs = chat(theirs_page, world.url, "Bob also asks about the quetzal flag.")
    page.goto(world.url + "/")
    expect(page.locator(f"#session-{other}")).to_be_visible()
    page.get_by_label("Search sessions").press_sequentially("quetz", delay=40)
    hits = page.locator("#session-list li.session")
    expect(hits).to_have_count(1)
    expect(page.locator(f"#session-{wanted} .snippet mark")).to_have_text("quetz")
    expect(page.locator(f"#session-{wanted} .snippet")).to_contain_text("why the quetzal flag")
    expect(page.locator(f"#session-{theirs}")).to_have_count(0)
    assert page.url == world.url + "/", "as-you-type results come by htmx, the page stays"
    screenshot(page, "search-as-you-type")
    page.get_by_label("Search sessions").fill("nothing like it")
    expect(page.locator("#search-summary")).to_have_text("No session matches.")
    # without scripts the box is a plain form
    page.goto(world.url + "/?q=" + "loader")
    expect(page.locator("#session-list li.session")).to_have_count(1)
    page.locator(f"#session-{wanted} a.title").click()
    expect(page).to_have_url(re.compile(rf"/sessions/{wanted}/$"))


def result_text(page: Any, url: str) -> str:
    """What a result's page shows: the text the model was sent, then the full stored text."""
    page.goto(url)
    return str(page.locator("pre.inserted").text_content()) + "\n" + str(page.locator("#full-text").inner_text())


def test_export_then_import_round_trip_opens_the_same_results(browser: Browser, world: World, tmp_path: Any) -> None:
    world.model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"}), ("read", {"path": "app.py"})]),
        Step(text="The notes have 40 lines."),
    )
    page = browser.page("ada")
    original = chat(page, world.url, "How long are the notes?")
    expect(page.locator("#transcript .tool")).to_have_count(2)
    page.get_by_text("Export", exact=True).click()
    with page.expect_download() as markdown_download:
        page.get_by_role("link", name="Markdown").click()
    markdown = markdown_download.value
    assert markdown.suggested_filename == f"cachet-{original}-how-long-are-the-notes.md"
    markdown.save_as(tmp_path / "export.md")
    text = (tmp_path / "export.md").read_text()
    assert "- `#0001 read notes.md — lines 1-40 of 40`" in text and "- `#0002 read app.py — lines 1-2 of 2`" in text
    with page.expect_download() as json_download:
        page.get_by_role("link", name="JSON").click()
    exported = tmp_path / "export.json"
    json_download.value.save_as(exported)
    screenshot(page, "export-menu")
    page.goto(world.url + "/")
    page.get_by_text("Import", exact=True).first.click()
    page.set_input_files("#import-file", str(exported))
    page.select_option("#import-workspace", label=world.workspace.name)
    page.get_by_role("button", name="Import").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    imported = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert imported != original
    wait_idle(page)
    expect(page.locator("#transcript .tool")).to_have_count(2)
    expect(page.locator("#transcript .reply").last).to_have_text("The notes have 40 lines.")
    for number in (1, 2):
        copy = result_text(page, f"{world.url}/sessions/{imported}/results/{number}/")
        first = result_text(page, f"{world.url}/sessions/{original}/results/{number}/")
        assert copy == first and copy, "the imported result opens with identical text"
    assert "40: line 40 of the notes" in result_text(page, f"{world.url}/sessions/{imported}/results/1/")
    # and the imported session goes on
    page.goto(f"{world.url}/sessions/{imported}/")
    wait_idle(page)
    world.model.push(Step(text="Still here."))
    send(page, "Are you still there?")
    expect(page.locator("#transcript article").last).to_have_attribute("data-status", "done")
    expect(page.locator("#transcript .reply").last).to_have_text("Still here.")
    # a bad file: a clear message, nothing made
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "cachet-session", "version": 1, "session": {}}')
    page.goto(world.url + "/")
    page.get_by_text("Import", exact=True).first.click()
    page.set_input_files("#import-file", str(bad))
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#import-error")).to_have_text("session.title: missing")
    expect(page.locator("#session-list li.session")).to_have_count(2)
