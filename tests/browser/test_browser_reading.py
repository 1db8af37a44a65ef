"""Reading comfort in Chromium: math as MathML, Copy on code blocks and replies (live, at page load and
scrolled up), markdown formatted while it streams, and a person's own line breaks."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession
from testing.scripted_server import Step
from tests.agent.loop_helpers import run
from tests.browser.browser_kit import Browser, World, in_thread, screenshot
from tests.browser.test_browser_chat import LONG_REPLY, send, start_session, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)

MATH_REPLY = (
    "Einstein wrote $E = mc^2$, and \\(a^2 + b^2 = c^2\\) is older.\n\n"
    "$$\n\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}\n$$\n\n"
    "Tickets cost $5 and $10; `$x$` stays code.\n\n"
    "```python\nprint('hi')\n```\n"
)


def with_clipboard(browser: Browser, world: World) -> Any:
    page = browser.page("ada")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=world.url)
    return page


def clipboard(page: Any) -> str:
    return str(page.evaluate("() => navigator.clipboard.readText()"))


def copy(page: Any, button: Any, expected: str) -> None:
    """Click ``button``: it says Copied for a moment, and the clipboard holds ``expected``."""
    page.evaluate("() => navigator.clipboard.writeText('')")
    shown = button.evaluate(
        """button => new Promise(resolve => {
             const seen = [];
             const done = () => { watch.disconnect(); resolve(seen); };
             const watch = new MutationObserver(() => {
               seen.push(button.textContent);
               if (seen.length >= 2) done();  // the label came back
             });
             watch.observe(button, {childList: true, characterData: true, subtree: true});
             button.click();
             setTimeout(done, 15000);
           })"""
    )
    assert shown == ["Copied", "Copy"], shown
    assert clipboard(page) == expected


def test_math_is_mathml_and_copy_gives_the_code_and_the_replys_markdown(browser: Browser, world: World) -> None:
    world.model.push(Step(text=MATH_REPLY, chunk_size=5, delay=0.005))
    page = with_clipboard(browser, world)
    session_id = start_session(page)
    send(page, "Some math?")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    reply = page.locator("#turn-1 .reply")
    expect(reply.locator("math")).to_have_count(3)
    expect(reply.locator('math[display="block"]')).to_have_count(1)
    offset = page.evaluate(
        """() => {
             const math = document.querySelector('#turn-1 .reply math[display="block"]');
             const box = math.getBoundingClientRect();
             const tokens = [...math.querySelectorAll('mi, mn, mo, mtext')].map((t) => t.getBoundingClientRect());
             const left = Math.min(...tokens.map((t) => t.left)), right = Math.max(...tokens.map((t) => t.right));
             return (left + right) / 2 - (box.left + box.right) / 2;
           }"""
    )
    assert abs(offset) < 4, f"display math is centred, as in a paper: {offset:.0f} px off"
    expect(reply.locator("math msup").first).to_have_text("c2")
    assert page.evaluate("() => document.querySelector('#turn-1 .reply math').namespaceURI") == (
        "http://www.w3.org/1998/Math/MathML"
    )
    expect(reply).to_contain_text("Tickets cost $5 and $10;")
    expect(reply.locator("code").first).to_have_text("$x$")
    screenshot(page, "reading-math")
    # Copy on a reply that came over the websocket
    copy(page, reply.locator(".code-block").get_by_role("button", name="Copy"), "print('hi')\n")
    copy(page, page.locator("#turn-1 .reply-tools").get_by_role("button", name="Copy"), MATH_REPLY)
    # and on the same reply as the page loads it
    page.goto(world.url + f"/sessions/{session_id}/")
    wait_idle(page)
    copy(page, page.locator("#turn-1 .code-block button.copy"), "print('hi')\n")
    copy(page, page.locator("#turn-1 .reply-tools button.copy"), MATH_REPLY)


def test_copy_on_a_reply_loaded_by_scrolling_up(browser: Browser, world: World) -> None:
    page = with_clipboard(browser, world)
    session_id = start_session(page)
    session = in_thread(lambda: ChatSession.objects.get(pk=session_id))
    for number in range(1, 23):
        world.model.push(Step(text=f"Answer **{number}**."))
        in_thread(lambda number=number: run(ReplyLoop(session).send(f"Question {number}")))
    served = page.request.get(world.url + f"/sessions/{session_id}/").text()
    assert 'id="turn-3"' in served and 'id="turn-1"' not in served, "the first turns come when scrolled to"
    page.goto(world.url + f"/sessions/{session_id}/")
    wait_idle(page)
    page.mouse.wheel(0, -100_000)
    expect(page.locator("#turn-1")).to_be_attached()
    copy(page, page.locator("#turn-1 .reply-tools button.copy"), "Answer **1**.")


NO_CLIPBOARD_API = """
window.cachetClipboard = navigator.clipboard;
Object.defineProperty(Navigator.prototype, "clipboard", { get: () => undefined, configurable: true });
"""


def test_copy_works_where_the_page_gets_no_clipboard_api(browser: Browser, world: World) -> None:
    """Served over plain HTTP at a LAN address, the page is no secure context and has no ``navigator.clipboard``:
    Copy falls back to the selection and still fills the clipboard, for a code block and for a whole reply."""
    world.model.push(Step(text="Here:\n\n```python\nprint('hi')\n```\n"))
    page = with_clipboard(browser, world)
    page.context.add_init_script(NO_CLIPBOARD_API)
    start_session(page)
    send(page, "Code?")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    assert page.evaluate("() => navigator.clipboard === undefined"), "the page sees no clipboard API"
    for button, expected in (
        (page.locator("#turn-1 .code-block button.copy"), "print('hi')\n"),
        (page.locator("#turn-1 .reply-tools button.copy"), "Here:\n\n```python\nprint('hi')\n```\n"),
    ):
        page.evaluate("() => window.cachetClipboard.writeText('')")
        button.click()
        expect(button).to_have_text("Copied")
        assert page.evaluate("() => window.cachetClipboard.readText()") == expected
    expect(page.locator(".copy-buffer")).to_have_count(0)


def test_markdown_is_formatted_while_the_reply_streams(browser: Browser, world: World) -> None:
    text = "**Bold start** then a list:\n\n- item one\n- item two\n\n" + LONG_REPLY
    # the answer stops after "word6" until the page has been seen in the middle of it (``pause_at``)
    world.model.push(Step(text=text, chunk_size=3, pause_at=(32,)))
    page = browser.page("ada")
    start_session(page)
    send(page, "Stream slowly")
    assert world.model.wait_paused(1)
    live = page.locator("#live-1")
    expect(live.locator(".stream-md strong")).to_have_text("Bold start")
    expect(live.locator(".stream-md ul li")).to_have_count(2)
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "open")
    expect(live.locator(".stream")).to_be_hidden()
    page.wait_for_function("() => document.querySelector('#render-1').textContent.includes('word5')")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "open")
    screenshot(page, "reading-streaming")
    world.model.resume()
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done", timeout=30_000)
    wait_idle(page)
    expect(page.locator("#turn-1 .reply strong")).to_have_text("Bold start")
    expect(page.locator("#turn-1 .reply")).to_contain_text("word119")
    expect(page.locator("#turn-1 .stream-md")).to_have_count(0)


def test_a_persons_line_breaks_are_kept(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Noted."))
    page = browser.page("ada")
    start_session(page)
    page.fill("#composer-text", "first line")
    page.press("#composer-text", "Shift+Enter")
    page.type("#composer-text", "second line")
    page.press("#composer-text", "Enter")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    words = page.locator("#turn-1 .words")
    expect(words.locator("br")).to_have_count(1)
    assert words.inner_text() == "first line\nsecond line"
