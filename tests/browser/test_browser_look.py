"""How the pages look and what a person notices, in Chromium: Dark mode (the system's and the person's own,
remembered), what Enter and Esc do at the edges, a reply finishing in a hidden tab, and the phone layout."""

from __future__ import annotations

import itertools
import re
import socket
from typing import Any

import pytest
from playwright.sync_api import expect

from sessions_app.models import ModelEndpoint
from testing.scripted_server import Step
from tests.browser.browser_kit import PHONE, Browser, World, in_thread, login, screenshot
from tests.browser.test_browser_chat import LONG_REPLY, send, start_session, wait_idle

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


def test_enter_before_the_session_is_ready_is_kept_and_sent_once_it_is(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Got it."))
    page = browser.page("ada")
    session_id = start_session(page)
    # hold the socket between the page and Cachet: the page sees it open ("live") but the server does not answer
    # yet, so Send is not enabled; what the page says goes to Cachet once the test lets it through
    held: dict[str, Any] = {"page": None, "server": None, "pending": []}

    def from_page(message: str | bytes) -> None:
        if held["server"] is None:
            held["pending"].append(message)
        else:
            held["server"].send(message)

    def route(socket: Any) -> None:
        held["page"] = socket
        socket.on_message(from_page)

    page.route_web_socket(re.compile(r"/ws/sessions/"), route)
    page.goto(f"{world.url}/sessions/{session_id}/")
    expect(page.locator("#ws-status")).to_have_text("live")
    expect(page.locator("#send-button")).to_be_disabled()
    send(page, "Hello before the page is ready")
    expect(page.locator("#composer-wait")).to_contain_text("sent as soon as")
    expect(page.locator("#composer-text")).to_have_value("Hello before the page is ready")
    assert len(world.model.requests) == 0
    screenshot(page, "enter_queued")

    server = held["page"].connect_to_server()
    server.on_message(lambda message: held["page"].send(message))
    held["server"] = server
    for message in held["pending"]:
        server.send(message)
    expect(page.locator("#turn-1 .reply")).to_have_text("Got it.")
    expect(page.locator("#turn-1 .words")).to_have_text("Hello before the page is ready")
    expect(page.locator("#composer-text")).to_have_value("")
    expect(page.locator("#composer-wait")).to_be_hidden()
    wait_idle(page)
    assert len(world.model.requests) == 1, "sent once"


def test_esc_stops_a_running_reply_and_enter_meanwhile_says_why_it_waits(browser: Browser, world: World) -> None:
    world.model.push(Step(text=LONG_REPLY, chunk_size=2, pause_at=(15,)), Step(text="Short."))
    page = browser.page("ada")
    start_session(page)
    send(page, "Tell me a long story")
    assert world.model.wait_paused(1)  # the answer waits after 30 characters: stopped in the middle
    page.wait_for_function("() => (document.querySelector('#stream-1') || {}).textContent?.length > 20")
    send(page, "And then?")
    expect(page.locator("#composer-wait")).to_contain_text("A reply is running")
    expect(page.locator("#composer-text")).to_have_value("And then?")
    page.keyboard.press("Escape")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "interrupted")
    expect(page.locator("#turn-1 .turn-error")).to_contain_text("Stopped.")
    wait_idle(page)
    expect(page.locator("#composer-wait")).to_be_hidden()
    page.press("#composer-text", "Enter")
    expect(page.locator("#turn-2 .reply")).to_have_text("Short.")


FAKE_NOTIFICATION = """
  window.notified = [];
  window.Notification = class {
    static get permission() { return localStorage.getItem("test-permission") || "default"; }
    static requestPermission() {
      localStorage.setItem("test-permission", "granted");
      return Promise.resolve("granted");
    }
    constructor(title, options) { window.notified.push([title, options && options.body]); }
  };
"""
HIDE = """(hidden) => {
  Object.defineProperty(document, "hidden", { configurable: true, get: () => hidden });
  Object.defineProperty(document, "visibilityState", { configurable: true, get: () => hidden ? "hidden" : "visible" });
  document.dispatchEvent(new Event("visibilitychange"));
}"""


def test_a_reply_finished_in_a_hidden_tab_marks_the_title_and_notifies(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Seen at once."), Step(text="Done while you were away.", chunk_size=3, delay=0.02))
    page = browser.page("ada")
    page.context.add_init_script(FAKE_NOTIFICATION)
    start_session(page)
    title = page.title()
    send(page, "First")
    expect(page.locator("#turn-1 .reply")).to_have_text("Seen at once.")
    wait_idle(page)
    assert page.title() == title, "a reply seen as it finished changes nothing"
    page.get_by_role("button", name="More").click()
    page.get_by_label("Notify me").check()
    expect(page.get_by_label("Notify me")).to_be_checked()
    page.get_by_role("button", name="More").click()
    assert page.evaluate("Notification.permission") == "granted"

    page.evaluate(HIDE, True)
    send(page, "Second")
    expect(page).to_have_title(f"● Reply ready — {title}")
    assert page.evaluate("window.notified") == [["Reply ready", "First"]], "named by the session's title"
    page.evaluate(HIDE, False)
    expect(page).to_have_title(title)
    # Notify me is remembered in this browser
    page.reload()
    expect(page.get_by_label("Notify me")).to_be_checked()


def box(page: Any, selector: str) -> dict[str, float]:
    found: dict[str, float] | None = page.locator(selector).bounding_box()
    assert found is not None, f"{selector} is not shown"
    return found


def test_the_phone_layout_pins_the_composer_keeps_one_row_and_puts_the_chart_behind_a_tab(
    browser: Browser, world: World
) -> None:
    world.model.push(
        Step(text="Reading the notes.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text="The notes count **forty** lines.\n\n" + LONG_REPLY),
    )
    page = browser.page("ada", **PHONE)
    screenshot(page, "phone_sessions")
    start_session(page)
    send(page, "How long are the notes?")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    expect(page.locator(".phone-tabs")).to_be_visible()
    expect(page.locator("#chart")).to_be_hidden()
    header = box(page, "header.top")
    assert header["height"] < 50, "the header stays one line"
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "phone_chat_top")
    # the composer sits at the bottom of the screen, wherever the conversation is scrolled
    for scroll in ("0", "document.body.scrollHeight"):
        page.evaluate(f"window.scrollTo(0, {scroll})")
        dock, text = box(page, ".dock"), box(page, "#composer-text")
        assert abs(dock["y"] + dock["height"] - 844) < 1, dock
        assert text["y"] > 844 - 200 and text["y"] + text["height"] <= 844, text
    # attach, the mode, More and Send in one row, all on the screen (Stop takes Send's place while a reply runs)
    row = [box(page, selector) for selector in (".attach-button", "#mode-select", "#more-button", "#send-button")]
    assert all(abs(b["y"] + b["height"] / 2 - row[0]["y"] - row[0]["height"] / 2) < 3 for b in row), row
    assert all(b["x"] >= 0 and b["x"] + b["width"] <= 390 for b in row), row
    assert all(left["x"] + left["width"] <= right["x"] for left, right in itertools.pairwise(row)), row
    expect(page.locator("#stop-button")).to_be_hidden()
    expect(page.locator(".compact-proxy")).to_be_hidden()
    expect(page.locator("#restore-files")).to_be_hidden()
    screenshot(page, "phone_chat")

    # More opens the less-used controls, above the row
    page.get_by_role("button", name="More").tap()
    expect(page.get_by_label("restore files")).to_be_visible()
    expect(page.locator("#options").get_by_role("button", name="Undo")).to_be_visible()
    expect(page.locator("#options").get_by_role("button", name="Regenerate")).to_be_visible()
    expect(page.locator(".compact-proxy")).to_be_visible()
    expect(page.locator(".export-links").get_by_role("link", name="JSON")).to_be_visible()
    expect(page.locator("#export-menu")).to_be_hidden()
    options = box(page, "#options")
    assert options["y"] >= 0 and options["y"] + options["height"] <= box(page, "#more-button")["y"]
    screenshot(page, "phone_more")
    page.get_by_label("restore files").tap()
    expect(page.locator("#restore-files")).to_be_checked()
    page.get_by_role("button", name="More").tap()
    expect(page.locator("#options")).to_be_hidden()

    # Settings and Share stay in the head on a phone, and open on the screen
    page.locator("#settings-menu summary").tap()
    expect(page.get_by_label("Temperature")).to_be_visible()
    settings_box = box(page, "#settings-menu .export-choices")
    assert settings_box["x"] >= 0 and settings_box["x"] + settings_box["width"] <= 390, settings_box
    screenshot(page, "phone_settings")
    page.locator("#settings-menu summary").tap()
    page.locator("#share-menu summary").tap()
    expect(page.locator("#share-start")).to_be_visible()
    share_box = box(page, "#share-menu .export-choices")
    assert share_box["x"] >= 0 and share_box["x"] + share_box["width"] <= 390, share_box
    screenshot(page, "phone_share")
    page.locator("#share-menu summary").tap()

    # the chart behind the Cache tab; a tapped bar shows its figures
    page.get_by_role("tab", name="Cache").tap()
    expect(page.locator("#chart")).to_be_visible()
    expect(page.locator("#composer-text")).to_be_hidden()
    expect(page.locator("#chart .chart-bar")).to_have_count(2)
    chart = box(page, "#chart")
    assert chart["x"] >= 0 and chart["x"] + chart["width"] <= 390, chart
    page.locator("#chart .chart-bar").nth(1).tap()
    expect(page.locator("#bar-figures")).to_contain_text("Request 2")
    expect(page.locator("#bar-figures")).to_contain_text("prompt tokens")
    screenshot(page, "phone_cache")
    page.get_by_role("tab", name="Chat").tap()
    expect(page.locator("#composer-text")).to_be_visible()

    # the desktop layout: no tabs, the same row and More, the chart beside the talk
    desk = browser.page("ada")
    desk.goto(page.url)
    wait_idle(desk)
    expect(desk.locator(".phone-tabs")).to_be_hidden()
    expect(desk.locator("#more-button")).to_be_visible()
    expect(desk.locator("#mode-select")).to_be_visible()
    expect(desk.locator("#restore-files")).to_be_hidden()
    desk.locator("#more-button").click()
    expect(desk.locator(".compact-proxy")).to_be_visible()
    expect(desk.locator(".export-links")).to_be_hidden()  # Export is in the head
    desk.locator("#more-button").click()
    assert box(desk, "#chart")["x"] > box(desk, "#composer-text")["x"] + box(desk, "#composer-text")["width"]


def test_on_a_phone_an_admins_header_shows_every_control_on_the_screen(browser: Browser, world: World) -> None:
    admin = world.users["ada"]
    admin.is_staff = True
    in_thread(admin.save, update_fields=["is_staff"])
    page = browser.page("ada", **PHONE)
    expect(page.get_by_role("link", name="Admin")).to_be_visible()
    expect(page.locator("#sidebar")).to_be_hidden()
    expect(page.get_by_role("button", name="Sessions")).to_be_visible()  # the way to the list: the drawer
    expect(page.locator(".theme-label .icon")).to_be_visible()  # the select shows what it is
    expect(page.get_by_label("Dark mode")).to_be_visible()
    for selector in (
        "header.top .brand",
        "header.top nav a[href$='/admin/']",
        "#sidebar-toggle",
        ".theme-label .icon",
        "#theme-select",
        "#password-link",
        "#logout",
    ):
        shown = box(page, selector)
        assert shown["x"] >= 0 and shown["x"] + shown["width"] <= 390, (selector, shown)
    screenshot(page, "phone_admin_header")


def test_leaving_a_page_while_htmx_still_waits_logs_no_error(browser: Browser, world: World) -> None:
    """The model menu asks every endpoint's server; one that never answers keeps the request waiting, and
    leaving the page then aborts it: htmx would log that as an error."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections wait in the backlog: the request is sent, no answer comes
    try:
        port = silent.getsockname()[1]
        in_thread(
            lambda: ModelEndpoint.objects.create(name="silent", base_url=f"http://127.0.0.1:{port}/v1", model="m")
        )
        page = browser.page("ada")
        start_session(page)
        with page.expect_request(lambda request: request.url.endswith("/models")):
            page.locator("#model-control summary").click()
        page.get_by_role("link", name="Sessions", exact=True).click()
        page.wait_for_url(world.url + "/")
        expect(page.locator("h1")).to_have_text("Your sessions")
    finally:
        silent.close()


def test_keyboard_shortcuts_for_a_new_session_the_message_box_and_the_search(browser: Browser, world: World) -> None:
    page = browser.page("ada")
    page.keyboard.press("/")
    expect(page.locator("#search-q")).to_be_focused()
    page.keyboard.type("x/")
    expect(page.locator("#search-q")).to_have_value("x/")  # typed in a field, / is a slash
    page.keyboard.press("Control+Shift+O")
    page.wait_for_url(world.url + "/sessions/new")
    expect(page.locator("#composer-text")).to_be_focused()
    page.select_option("select[name=workspace]", label="demo")
    world.model.push(Step(text="Hello."))
    page.locator("#composer-text").click()
    page.keyboard.type("Hi")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    page.locator("h1").click()
    page.keyboard.press("Shift+Escape")
    expect(page.locator("#composer-text")).to_be_focused()


def test_the_chart_opens_at_its_newest_bars_and_keeps_them_in_view(browser: Browser, world: World) -> None:
    """The chart opened at its oldest bars and never scrolled: with 22 requests, the newest were out of view at
    1440 px. It opens at the newest, a new bar keeps them in view, and a person who scrolled back stays there."""

    def newest_in_view(page: Any) -> bool:
        return bool(
            page.evaluate(
                """() => {
                  const bars = document.querySelectorAll('#chart-bars .chart-bar');
                  const plot = document.getElementById('chart-bars').parentElement.getBoundingClientRect();
                  const last = bars[bars.length - 1].getBoundingClientRect();
                  return last.left >= plot.left - 1 && last.right <= plot.right + 1;
                }"""
            )
        )

    steps = [Step(text="", tool_calls=[("glob", {"pattern": f"*{number}"})]) for number in range(29)]
    world.model.push(*steps, Step(text="Done looking."))
    page = browser.page("ada", viewport={"width": 1440, "height": 900})
    start_session(page)
    send(page, "Look around")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done", timeout=60_000)
    expect(page.locator("#chart .chart-bar")).to_have_count(30)
    assert page.evaluate(
        "() => { const p = document.getElementById('chart-bars').parentElement; return p.scrollWidth > p.clientWidth; }"
    ), "30 bars are more than the plot shows"
    assert newest_in_view(page), "the bars that came as the reply ran stayed in view"
    page.reload()
    expect(page.locator("#chart .chart-bar")).to_have_count(30)
    page.wait_for_function("() => document.getElementById('chart-bars').parentElement.scrollLeft > 0")
    assert newest_in_view(page), "the page opens at the newest bars"
    page.evaluate("() => { document.getElementById('chart-bars').parentElement.scrollLeft = 0; }")
    world.model.push(Step(text="Again."))
    send(page, "Once more")
    expect(page.locator("#chart .chart-bar")).to_have_count(31)
    assert page.evaluate("() => document.getElementById('chart-bars').parentElement.scrollLeft") == 0, (
        "a person who scrolled back to older bars is left there"
    )


def test_menus_open_in_view_and_the_header_and_box_stay_in_a_long_session(browser: Browser, world: World) -> None:
    """At 1280 px Settings, Share and Export ran off the right edge (Temperature and the Copy button out of reach),
    "Retry with another model…" opened its menu in a header scrolled off the top, and the header and the message
    box scrolled away in a long session."""
    long_text = "\n\n".join(f"Paragraph {n}: " + LONG_REPLY for n in range(12))
    world.model.push(Step(text=long_text), Step(text=long_text), Step(fault="http500"))
    page = browser.page("ada", viewport={"width": 1280, "height": 800})
    start_session(page)
    send(page, "Tell me a lot")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    send(page, "And more")
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    wait_idle(page)
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight / 2)")

    def box(selector: str) -> dict[str, float]:
        return dict(page.locator(selector).bounding_box() or {})

    head, dock = box(".chat-head"), box(".dock")
    assert head["y"] >= -1 and dock["y"] + dock["height"] <= 801, (head, dock)
    for menu in ("#settings-menu", "#share-menu", "#export-menu"):
        page.click(f"{menu} > summary")
        panel = box(f"{menu} > .export-choices")
        assert panel["x"] >= 0 and panel["x"] + panel["width"] <= 1280, (menu, panel)
        page.click(f"{menu} > summary")
    for width in (360, 1920):  # from a small phone to a large screen, every menu opens inside the window
        page.set_viewport_size({"width": width, "height": 800})
        menus = ("#settings-menu", "#share-menu") if width < 601 else ("#settings-menu", "#share-menu", "#export-menu")
        for menu in menus:
            page.click(f"{menu} > summary")
            panel = box(f"{menu} > .export-choices")
            assert panel["x"] >= 0 and panel["x"] + panel["width"] <= width, (width, menu, panel)
            page.click(f"{menu} > summary")
        for control in (".attach-button", "#mode-select", "#more-button", "#send-button"):
            found = box(control)
            assert found["x"] >= 0 and found["x"] + found["width"] <= width, (width, control, found)
        page.click("#more-button")
        options = box("#options")
        assert options["x"] >= 0 and options["x"] + options["width"] <= width and options["y"] >= 0, (width, options)
        page.click("#more-button")
    page.set_viewport_size({"width": 1280, "height": 800})
    send(page, "Once more")
    expect(page.locator("#turn-3 .retry-other")).to_be_visible()
    wait_idle(page)
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    page.locator("#turn-3 .retry-other").click()
    expect(page.locator("#model-control")).to_have_attribute("open", "")
    choices = box("#model-control > .model-choices")
    assert 0 <= choices["y"] < 800 and choices["x"] + choices["width"] <= 1280, choices


def test_question_mark_shows_the_keys_and_esc_closes_them_without_stopping_a_reply(
    browser: Browser, world: World
) -> None:
    world.model.push(Step(text=LONG_REPLY, chunk_size=3, delay=0.05))
    page = browser.page("ada")
    start_session(page)
    send(page, "Take your time")
    expect(page.locator("#controls")).to_have_attribute("data-state", "running")
    page.locator("#transcript").click()  # out of the message box: ? is typed there otherwise
    page.keyboard.press("?")
    sheet = page.get_by_role("dialog", name="Keys")
    expect(sheet).to_be_visible()
    expect(sheet).to_contain_text("stop the reply")
    expect(sheet.locator("kbd", has_text="Shift+Enter")).to_have_count(1)
    page.keyboard.press("Escape")
    expect(sheet).to_be_hidden()
    expect(page.locator("#controls")).to_have_attribute("data-state", "running")  # Esc closed the sheet, no more
    page.keyboard.press("Escape")
    wait_idle(page)
    page.locator("#composer-text").fill("")
    page.locator("#composer-text").press("?")
    expect(sheet).to_be_hidden()
    expect(page.locator("#composer-text")).to_have_value("?")
