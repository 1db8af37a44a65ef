"""The usage page as people meet it: a person's reply shows in their usage at once, staff see it under that person
and narrow to them, the CSV downloads, and on a phone the page fits the screen."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from playwright.sync_api import expect

from testing.scripted_server import Step
from tests.browser.browser_kit import PHONE, Browser, World, in_thread
from tests.browser.test_browser_chat import send, start_session, wait_idle


def test_a_reply_shows_in_the_persons_usage_and_staff_see_it_per_person(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="40 lines."))
    ada = browser.page("ada")
    start_session(ada)
    send(ada, "How long are the notes?")
    expect(ada.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(ada)

    ada.locator("#usage-link").click()
    expect(ada.locator("h1")).to_have_text("Usage")
    figures = ada.locator("#usage-figures")
    expect(figures.locator("div").first).to_contain_text("Requests2")
    expect(ada.locator("#usage-people")).to_have_count(0)
    expect(ada.locator("#usage-endpoints tbody tr")).to_have_count(1)
    expect(ada.locator("#usage-chart rect.processed").last).to_have_attribute("y", "0.0")  # the tallest bar: today

    bob = world.users["bob"]
    bob.is_staff = True
    in_thread(bob.save, update_fields=["is_staff"])
    staff = browser.page("bob")
    staff.goto(world.url + "/usage/")
    expect(staff.locator("h1")).to_have_text("Usage of everyone")
    staff.locator("#usage-people tbody a", has_text="ada").click()
    expect(staff.locator("h1")).to_have_text("Usage")
    assert "person=" in staff.url
    with staff.expect_download() as downloading:
        staff.locator("#usage-csv").click()
    saved = Path(downloading.value.path())
    rows = list(csv.DictReader(io.StringIO(saved.read_text())))
    assert [(row["person"], row["requests"]) for row in rows] == [("ada", "2")]

    phone = browser.page("ada", **PHONE)
    phone.goto(world.url + "/")
    phone.locator("#sidebar-toggle").click()
    phone.locator("#sidebar-usage").click()  # on a phone, Usage is at the foot of the drawer
    expect(phone.locator("h1")).to_have_text("Usage")
    phone.goto(world.url + "/usage/?days=365")
    expect(phone.locator("#usage-chart rect.cached")).to_have_count(365)
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "nothing wider than a phone"
