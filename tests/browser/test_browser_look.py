"""How the pages look and what a person notices, in Chromium: Dark mode (the system's and the person's own,
remembered), what Enter and Esc do at the edges, a reply finishing in a hidden tab, and the phone layout."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from chat.testing.scripted_server import Step
from tests.browser.browser_kit import Browser, World, login, screenshot
from tests.browser.test_browser_chat import send, start_session, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)


def luminance(page: Any, selector: str, prop: str = "background-color") -> float:
    """The relative brightness (0 black … 1 white) of ``selector``'s computed colour ``prop``."""
    value = page.eval_on_selector(selector, f"e => getComputedStyle(e).getPropertyValue('{prop}')")
    red, green, blue = (int(part) for part in re.findall(r"\d+", value)[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def choose_theme(page: Any, theme: str) -> None:
    with page.expect_response(lambda response: response.url.endswith("/settings/theme")) as saved:
        page.get_by_label("Dark mode").select_option(theme)
    assert saved.value.status == 204


def test_dark_mode_follows_the_system_and_the_persons_choice_is_remembered(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Here:\n\n```python\ndef greet(name):\n    return 'hi ' + name\n```"))
    page = browser.page(user=None, color_scheme="dark")
    page.goto(world.url + "/login/")
    assert luminance(page, "body") < 0.15, "the login page follows the system"
    assert luminance(page, "body", "color") > 0.8
    screenshot(page, "dark_login")
    login(page, world.url, "ada")
    start_session(page)
    send(page, "Show me a greeting")
    expect(page.locator("#turn-1 .md pre .k").first).to_be_visible()
    wait_idle(page)
    assert luminance(page, "body") < 0.15
    assert luminance(page, "#chart") < 0.15, "the chart is dark too"
    assert luminance(page, ".turn .md pre") < 0.15, "and the code"
    expect(page.locator("#turn-1 .md pre .k").first).to_have_css("color", "rgb(255, 123, 114)")
    screenshot(page, "dark_session")

    # the person turns it off: at once, and after a reload (the server renders it: no flash)
    choose_theme(page, "light")
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert luminance(page, "body") > 0.9
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert luminance(page, "body") > 0.9
    expect(page.locator("#turn-1 .md pre .k").first).to_have_css("color", "rgb(0, 128, 0)")
    expect(page.get_by_label("Dark mode")).to_have_value("light")

    # in a light system, On makes it dark, remembered for this person in another browser context too
    other = browser.page("ada", color_scheme="light")
    assert luminance(other, "body") > 0.9
    choose_theme(other, "dark")
    assert luminance(other, "body") < 0.15
    other.goto(page.url)
    expect(other.locator("html")).to_have_attribute("data-theme", "dark")
    assert luminance(other, "body") < 0.15
    assert luminance(other, "#chart") < 0.15
    screenshot(other, "dark_chosen")
    # back to the system's preference
    choose_theme(other, "system")
    assert luminance(other, "body") > 0.9
    # another person's pages are their own
    bob = browser.page("bob", color_scheme="light")
    expect(bob.locator("html")).to_have_attribute("data-theme", "system")
