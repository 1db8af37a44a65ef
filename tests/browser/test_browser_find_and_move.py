"""Finding and moving sessions in Chromium: Search sessions as one types, Export, Import."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from chat.testing.scripted_server import Step
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
