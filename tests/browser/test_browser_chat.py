"""The browser app, driven in Chromium: log in, start a session, chat, tool results, undo, rewind,
regenerate, stop, reload, two tabs, failures, the chart, and what another user may not see."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urljoin

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from chat.tools import tool_list
from chat.web.forms import ModelChoice, model_for
from sessions_app import prompts
from sessions_app.models import ChatSession, ModelRequest, Turn, TurnStatus, Workspace
from sessions_app.selectors.sessions import endpoint_default
from sessions_app.services.sessions import session_start
from testing.scripted_server import Step
from tests.browser.browser_kit import (
    PHONE,
    Browser,
    World,
    from_more,
    in_thread,
    login,
    publish_screenshots,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)

LONG_REPLY = " ".join(f"word{n}" for n in range(120))


def start_session(page: Any, *, mode: str = "edit", workspace: str = "demo") -> int:
    """An empty session of the page's person on ``workspace``, opened: the tests of chatting send its first message
    from the session's own composer. (New chat stores a session with its first message: ``test_new_chat_…``.)"""

    username = page.locator("header.top .who").text_content()

    def started() -> int:
        user = User.objects.get(username=username)
        chosen = Workspace.objects.get(name=workspace)
        endpoint = endpoint_default()
        assert endpoint is not None
        return session_start(
            owner=user,
            workspace=chosen,
            endpoint=endpoint,
            model_name=model_for(ModelChoice(endpoint, "")),
            tools=tool_list(allow_commands=chosen.allow_commands),
            mode=mode,
        ).pk

    session_id = in_thread(started)
    page.goto(urljoin(page.url, f"/sessions/{session_id}/"))
    wait_idle(page)
    return session_id


def send(page: Any, text: str) -> None:
    """Type ``text`` and press Enter, as a person does once the page has loaded (its deferred scripts run: before
    them, Enter in the box is a new line; a page just navigated to may not be there yet)."""
    page.wait_for_load_state("domcontentloaded")
    page.fill("#composer-text", text)
    page.press("#composer-text", "Enter")


def wait_idle(page: Any) -> None:
    expect(page.locator("#controls")).to_have_attribute("data-state", "idle")


def requests_of(session_id: int) -> int:
    return int(in_thread(lambda: ModelRequest.objects.filter(session_id=session_id).count()))


def test_log_in_list_rename_delete_log_out(browser: Browser, world: World) -> None:
    page = browser.page(user=None)
    page.goto(world.url + "/")
    expect(page).to_have_url(re.compile(r"/login/$"))
    screenshot(page, "login")
    login(page, world.url, "ada")  # onto a message box, focused
    expect(page.locator("#composer-text")).to_be_focused()
    page.goto(world.url + "/")
    expect(page.locator("#session-list .empty")).to_be_visible()
    session_id = start_session(page)
    page.goto(world.url + "/")
    item = page.locator(f"#session-{session_id}")
    expect(item.locator(".title")).to_have_text("New session")
    item.locator(".rename summary").click()
    item.locator("input[name=title]").fill("Reading the notes")
    item.locator(".rename button").click()
    expect(page.locator(f"#session-{session_id} .title")).to_have_text("Reading the notes")
    page.reload()
    expect(page.locator(f"#session-{session_id} .title")).to_have_text("Reading the notes")
    screenshot(page, "sessions")
    page.once("dialog", lambda dialog: dialog.accept())
    expect(page.locator(f"#side-{session_id}")).to_have_count(1)
    page.locator(f"#session-{session_id} button.danger").click()
    expect(page.locator(f"#session-{session_id}")).to_have_count(0)
    expect(page.locator(f"#side-{session_id}")).to_have_count(0)  # the sidebar on the same page too
    assert in_thread(lambda: ChatSession.objects.get(pk=session_id).deleted_at is not None), "hidden, kept"
    page.click("#logout")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.goto(world.url + "/")
    expect(page).to_have_url(re.compile(r"/login/$"))
    page.goto(world.url + "/sessions/new")  # a deep link comes back to itself after the login
    expect(page).to_have_url(re.compile(r"/login/\?next=/sessions/new$"))


def test_chat_streams_shows_tool_results_and_the_chart(browser: Browser, world: World) -> None:
    world.model.push(
        Step(text="Let me read the notes.", tool_calls=[("read", {"path": "notes.md"})], chunk_size=4, delay=0.01),
        Step(
            text="The notes count **forty** lines.\n\n```python\nprint('hi')\n```\n\n"
            '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> [x](javascript:alert(1))\n\n'
            + LONG_REPLY,
            chunk_size=3,
            delay=0.01,
        ),
    )
    page = browser.page("ada")
    session_id = start_session(page)
    page.fill("#composer-text", "first line")
    page.press("#composer-text", "Shift+Enter")
    page.type("#composer-text", "second line")
    assert page.input_value("#composer-text") == "first line\nsecond line"
    assert world.model.requests == []
    page.press("#composer-text", "Enter")
    expect(page.locator("#composer-text")).to_have_value("")
    # tokens arrive one by one: the live text grows while the turn is still open
    page.wait_for_function(
        "() => { const s = document.querySelector('#stream-1');"
        " return s && s.textContent.includes('forty') && !s.textContent.includes('word119'); }"
    )
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "open")
    expect(page.locator("#controls")).to_have_attribute("data-state", "running")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    turn = page.locator("#turn-1")
    expect(turn.locator(".words")).to_contain_text("first line")
    expect(turn.locator(".reply strong")).to_have_text("forty")
    expect(turn.locator(".reply pre code .nb")).to_have_text("print")
    assert turn.locator(".reply img, .reply script").count() == 0
    assert page.evaluate("() => window.pwned") is None
    assert turn.locator(".reply a[href^=javascript]").count() == 0
    expect(page.locator("#session-title")).to_have_text("first line second line")
    # the tool call, compactly, then expanded
    row = turn.locator(".tool").first
    expect(row.locator("summary")).to_have_text(re.compile(r"#0001\s+read\s+notes\.md\s+— lines 1-40 of 40"))
    expect(row.locator(".inserted")).to_be_hidden()
    row.locator("summary").click()
    expect(row.locator(".inserted pre")).to_contain_text("40: line 40 of the notes")
    # the chart: one bar per request, with the first request's break marked
    assert requests_of(session_id) == len(world.model.requests) == 2
    expect(page.locator("#chart svg g.bar")).to_have_count(2)
    expect(page.locator("#chart svg g.bar").first).to_have_attribute("data-cause", "first")
    tooltip = page.locator("#chart .chart-bar").nth(1).get_attribute("data-figures")
    assert tooltip is not None and "cached tokens:" in tooltip and "time to first token:" in tooltip
    screenshot(page, "chat")
    # the full stored text, paged like recall
    href = row.locator("a.full-link").get_attribute("href")
    page.goto(world.url + href + "?offset=11&limit=10")
    expect(page.locator("h2")).to_contain_text("lines 11-20 of 40")
    expect(page.locator("#full-text")).to_contain_text("11: line 11 of the notes")
    expect(page.locator("#full-text")).not_to_contain_text("21: line 21")
    page.click("#next-page")
    expect(page.locator("#full-text")).to_contain_text("21: line 21 of the notes")
    screenshot(page, "result")
    # a second turn adds one bar per request as each finishes
    world.model.push(Step(text="Second answer."))
    page.goto(world.url + f"/sessions/{session_id}/")
    wait_idle(page)
    send(page, "And again?")
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    expect(page.locator("#chart svg g.bar")).to_have_count(3)
    expect(page.locator("#chart svg g.bar >> nth=2")).to_have_attribute("data-cause", "new_turn")


def test_undo_rewind_and_regenerate(browser: Browser, world: World) -> None:
    world.model.push(
        Step(
            text="Changing two files.",
            tool_calls=[
                ("write", {"path": "new.txt", "content": "made by the model\n"}),
                ("edit", {"path": "app.py", "old_string": "'hello '", "new_string": "'hi '"}),
            ],
        ),
        Step(text="Done: new.txt and app.py."),
        Step(text="Answer two."),
        Step(text="Answer three."),
    )
    page = browser.page("ada")
    start_session(page)
    for number, words in enumerate(["Change the files", "Second question", "Third question"], start=1):
        send(page, words)
        expect(page.locator(f"#turn-{number}")).to_have_attribute("data-status", "done")
        wait_idle(page)
    assert (world.folder / "new.txt").exists()
    expect(page.locator("#turn-1 .tool")).to_have_count(2)
    # undo: the last turn goes, its words come back into the box
    from_more(page, "Undo")
    expect(page.locator("#turn-3")).to_have_count(0)
    expect(page.locator("#composer-text")).to_have_value("Third question")
    expect(page.locator("#notice")).to_contain_text("Took back turn 3.")
    wait_idle(page)
    # regenerate: the last reply is asked again with the same message
    world.model.push(Step(text="Answer two, regenerated."))
    from_more(page, "Regenerate")
    expect(page.locator("#turn-4")).to_have_attribute("data-status", "done")
    expect(page.locator("#turn-2")).to_have_count(0)
    expect(page.locator("#turn-4 .words")).to_have_text("Second question")
    expect(page.locator("#turn-4 .reply")).to_have_text("Answer two, regenerated.")
    wait_idle(page)
    # rewind to turn 1, restoring files: new.txt goes, app.py was changed since, so it is a conflict
    (world.folder / "app.py").write_text("changed by a person\n")
    page.locator("#more-button").click()
    page.check("#restore-files")
    page.locator("#more-button").click()
    asked: list[str] = []

    def dismissed(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismissed)
    page.locator("#turn-1 .rewind").click()  # dismissed: nothing is taken back
    expect(page.locator("#turn-1")).to_have_count(1)
    assert asked == [
        "Rewind here? This takes back 2 turns (1 to 2). The files they changed are put back as they were, where "
        "nobody changed them since: new.txt, app.py."
    ], asked
    page.locator("#more-button").click()
    page.uncheck("#restore-files")
    page.locator("#more-button").click()
    page.once("dialog", dismissed)
    page.locator("#turn-4 .rewind").click()
    assert asked[-1] == "Rewind here? This takes back turn 2. They changed no file.", asked
    page.locator("#more-button").click()
    page.check("#restore-files")
    page.locator("#more-button").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#turn-1 .rewind").click()
    expect(page.locator("#transcript article")).to_have_count(0)
    expect(page.locator("#composer-text")).to_have_value("Change the files")
    notice = page.locator("#notice")
    expect(notice).to_contain_text("Took back turns 1 and 2; the files they changed were restored except:")
    expect(notice.locator(".notice-line")).to_contain_text("app.py")
    assert not (world.folder / "new.txt").exists()
    assert (world.folder / "app.py").read_text() == "changed by a person\n"
    screenshot(page, "rewind")
    statuses = in_thread(lambda: sorted(Turn.objects.values_list("number", "status")))
    assert statuses == [(n, TurnStatus.TAKEN_BACK) for n in (1, 2, 3, 4)]


def test_stop_mid_reply_then_retry(browser: Browser, world: World) -> None:
    world.model.push(Step(text=LONG_REPLY, chunk_size=2, pause_at=(15,)), Step(text="A short answer this time."))
    page = browser.page("ada")
    start_session(page)
    send(page, "Tell me a long story")
    assert world.model.wait_paused(1)  # the answer waits after 30 characters: stopped in the middle
    page.wait_for_function("() => (document.querySelector('#stream-1') || {}).textContent?.length > 20")
    page.click("#stop-button")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "interrupted")
    expect(page.locator("#turn-1 .turn-error")).to_contain_text("Stopped.")
    wait_idle(page)
    stored = in_thread(lambda: Turn.objects.get(number=1).reply_text)
    assert stored and "word119" not in stored
    expect(page.locator("#turn-1 .reply")).to_contain_text("word0")
    screenshot(page, "stopped")
    page.click("#turn-1 .retry")
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    expect(page.locator("#turn-1")).to_have_count(0)
    expect(page.locator("#turn-2 .reply")).to_have_text("A short answer this time.")


def test_continue_asks_the_model_to_go_on_after_a_stop_and_after_the_length_limit(
    browser: Browser, world: World
) -> None:
    world.model.push(Step(text=LONG_REPLY, chunk_size=2, pause_at=(15,)))
    page = browser.page("ada")
    start_session(page)
    send(page, "Tell me a long story")
    assert world.model.wait_paused(1)
    page.wait_for_function("() => (document.querySelector('#stream-1') || {}).textContent?.length > 20")
    page.click("#stop-button")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "interrupted")
    wait_idle(page)
    world.model.push(Step(text="word20 word21 and then", finish_reason="length"))
    page.locator("#turn-1 .turn-error").get_by_role("button", name="Continue").click()
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    words = prompts.continue_words()
    expect(page.locator("#turn-2 .words")).to_have_text(words)
    sent = json.loads(world.model.requests[-1])["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["content"].startswith("word0"), "the stopped reply, as it was"
    assert sent[-1]["content"].startswith(words)
    expect(page.locator("#turn-1 .continue")).to_be_hidden()  # only under the last reply
    expect(page.locator("#turn-2 .cut-off")).to_contain_text("length limit")
    wait_idle(page)
    world.model.push(Step(text="The end."))
    page.locator("#turn-2 .cut-off").get_by_role("button", name="Continue").click()
    expect(page.locator("#turn-3")).to_have_attribute("data-status", "done")
    expect(page.locator("#turn-3 .cut-off")).to_have_count(0)
    expect(page.locator("#turn-2 .cut-off")).to_be_hidden()
    assert browser.errors == []


def test_reload_mid_reply_two_tabs_and_closing_the_tab(browser: Browser, world: World) -> None:
    # the answer stops after 40 and after 400 characters until the test lets it go on (``pause_at``), so the
    # page is seen in the middle of the reply however fast the machine streams
    world.model.push(Step(text=LONG_REPLY, chunk_size=2, pause_at=(20, 200)))
    first = browser.page("ada")
    session_id = start_session(first)
    second = browser.page("ada")
    second.goto(world.url + f"/sessions/{session_id}/")
    wait_idle(second)
    send(first, "Tell me a long story")
    assert world.model.wait_paused(1)
    second.wait_for_function("() => (document.querySelector('#stream-1') || {}).textContent?.length > 30")
    # reloading shows the reply as far as it got, and it keeps streaming
    second.reload()
    expect(second.locator("#controls")).to_have_attribute("data-state", "running")
    expect(second.locator("#turn-1")).to_have_attribute("data-status", "open")
    second.wait_for_function("() => (document.querySelector('#stream-1') || {}).textContent?.length > 30")
    shown = len(second.locator("#stream-1").text_content() or "")
    world.model.resume()
    assert world.model.wait_paused(2)
    second.wait_for_function(f"() => (document.querySelector('#stream-1') || {{}}).textContent?.length > {shown}")
    # the tab that asked closes; the reply goes on and the other tab sees it end
    first.close()
    world.model.resume()
    expect(second.locator("#turn-1")).to_have_attribute("data-status", "done", timeout=30_000)
    expect(second.locator("#turn-1 .reply")).to_have_text(LONG_REPLY)
    text = second.locator("#turn-1 .reply").text_content()
    assert text is not None and text.count("word60 ") == 1
    assert in_thread(lambda: Turn.objects.get(number=1).reply_text) == LONG_REPLY


def test_a_failed_turn_shows_its_error_and_a_retry(browser: Browser, world: World) -> None:
    world.model.push(Step(fault="http500", text="the model fell over"), Step(text="Fine now."))
    page = browser.page("ada")
    start_session(page)
    send(page, "Hello?")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "failed")
    expect(page.locator("#turn-1 .turn-error")).to_contain_text("the model fell over")
    screenshot(page, "failed")
    page.click("#turn-1 .retry-other")
    expect(page.locator("#model-retry")).to_be_visible()  # the model menu opens, its retry box beside Use
    page.locator("#model-summary").click()
    page.click("#turn-1 .retry")
    expect(page.locator("#turn-2 .reply")).to_have_text("Fine now.")
    expect(page.locator("#chart svg g.bar")).to_have_count(2)


def test_mode_switch_and_compact_now(browser: Browser, world: World) -> None:
    world.model.push(
        Step(text="First."), Step(text="Second."), Step(text="A **summary** of it all."), Step(text="After.")
    )
    page = browser.page("ada")
    session_id = start_session(page)
    send(page, "One")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    # the mode switch takes effect as a note on the next message
    page.select_option("#mode-select", "plan")
    expect(page.locator("#notice")).to_contain_text("Mode plan")
    assert in_thread(lambda: ChatSession.objects.get(pk=session_id).mode) == "plan"
    send(page, "Two")
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    expect(page.locator("#turn-2 .note", has_text="mode plan")).to_have_count(1)
    wait_idle(page)
    # compact now: the summary shows as a marker; the next request breaks the prefix for that cause
    from_more(page, "Compact now")
    expect(page.locator(".compaction")).to_contain_text("Compacted")
    expect(page.locator(".compaction")).to_contain_text("turns up to 2")
    expect(page.locator("#chart svg g.bar")).to_have_count(3)
    wait_idle(page)
    send(page, "Three")
    expect(page.locator("#turn-3")).to_have_attribute("data-status", "done")
    expect(page.locator("#chart svg g.bar")).to_have_count(4)
    expect(page.locator("#chart svg g.bar >> nth=3")).to_have_attribute("data-cause", "compaction")


def test_another_user_gets_404_for_the_page_the_websocket_and_the_results(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="Read."))
    ada = browser.page("ada")
    session_id = start_session(ada)
    send(ada, "Read the notes")
    expect(ada.locator("#turn-1")).to_have_attribute("data-status", "done")
    bob = browser.page("bob")
    base = world.url + f"/sessions/{session_id}"
    for path in ("/", "/results/1/", "/chart"):
        response = bob.goto(base + path)
        assert response is not None and response.status == 404, path
    bob.goto(world.url + "/")
    code = bob.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url);
            socket.onmessage = () => resolve('message');
            socket.onclose = (event) => resolve(event.code);
        })""",
        world.url.replace("http", "ws") + f"/ws/sessions/{session_id}/",
    )
    assert code == 4404
    anonymous = browser.page(user=None)
    anonymous.goto(world.url + "/login/")
    code = anonymous.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url);
            socket.onopen = () => resolve('open');
            socket.onclose = (event) => resolve(event.code);
        })""",
        world.url.replace("http", "ws") + f"/ws/sessions/{session_id}/",
    )
    assert code == 1006
    browser.errors.clear()  # the 404 pages and the refused handshake log errors in the console


def test_a_person_removed_from_the_workspace_sees_the_session_read_only(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="Read."))
    ada = browser.page("ada")
    session_id = start_session(ada)
    send(ada, "Read the notes")
    expect(ada.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(ada)
    in_thread(lambda: world.workspace.members.add(world.users["bob"]))
    in_thread(lambda: Workspace.objects.filter(pk=world.workspace.pk).update(open_to_everyone=False))
    removed = "You are no longer a member of the workspace “demo”: this session is read-only."
    send(ada, "Still here?")  # the open tab: refused, the words back in the box
    expect(ada.locator("#notice")).to_have_text(removed)
    expect(ada.locator("#composer-text")).to_have_value("Still here?")
    ada.reload()
    expect(ada.locator("#read-only")).to_have_text(removed)
    expect(ada.locator("#ws-status")).to_have_text("live")
    expect(ada.locator("#composer")).to_have_count(0)
    expect(ada.locator("#controls")).to_have_count(0)
    expect(ada.locator("#turn-1 button.edit")).to_be_hidden()
    expect(ada.locator("#turn-1 button.rewind")).to_be_hidden()
    expect(ada.locator("#turn-1 .tool summary")).to_contain_text("notes.md")
    screenshot(ada, "read-only")
    ada.goto(world.url + "/")
    expect(ada.locator(f"#session-{session_id} .read-only-mark")).to_have_text("read-only")
    assert requests_of(session_id) == 2


def test_a_working_session_for_the_readme(browser: Browser, world: World) -> None:
    """A conversation with reads, a search and an edit: the screenshot the README shows."""
    world.model.push(
        Step(
            text="Let me find where the greeting is built.",
            tool_calls=[("grep", {"pattern": "name", "path": "."}), ("read", {"path": "app.py"})],
        ),
        Step(tool_calls=[("edit", {"path": "app.py", "old_string": "'hello '", "new_string": "'Hello there, '"})]),
        Step(
            text="The greeting is built in `greet()` in **app.py**. It now reads:\n\n"
            "```python\ndef greet(name):\n    return 'Hello there, ' + name\n```\n\n"
            "Nothing else calls it, so no other file needs a change.",
            chunk_size=6,
        ),
        Step(tool_calls=[("read", {"path": "notes.md", "offset": 1, "limit": 12})]),
        Step(
            text="The notes are a numbered list of 40 lines; the first twelve are:\n\n"
            "| lines | content |\n|---|---|\n| 1-12 | `line N of the notes` |\n\n"
            "Recall **#0004** shows them again.",
            chunk_size=6,
        ),
    )
    page = browser.page("ada")
    start_session(page)
    send(page, "Where is the greeting built? Make it a little friendlier.")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    send(page, "Thanks! What is in the notes?")
    expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
    wait_idle(page)
    expect(page.locator("#chart svg g.bar")).to_have_count(5)
    expect(page.locator("#chart-summary")).to_contain_text("5 requests · ")  # drawn again with each request
    expect(page.locator("#chart-summary")).to_contain_text("% cached")
    page.locator("#turn-1 .tool >> nth=2").locator("summary").click()
    assert "Hello there" in (world.folder / "app.py").read_text()
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.evaluate("() => window.scrollTo(0, 0)")
    shots = [screenshot(page, "readme")]
    page.emulate_media(color_scheme="dark")  # Dark mode "Auto" follows the system
    assert page.evaluate("() => matchMedia('(prefers-color-scheme: dark)').matches")
    shots.append(screenshot(page, "readme-dark"))
    phone = browser.page("ada", **PHONE)
    phone.goto(page.url)
    expect(phone.locator("#turn-2")).to_have_attribute("data-status", "done")
    phone.evaluate("() => window.scrollTo(0, 0)")
    shots.append(screenshot(phone, "readme-phone"))
    shown = page.locator("#transcript").inner_text() + page.locator("#chart").inner_text()
    assert str(world.folder) not in shown, [line for line in shown.splitlines() if str(world.folder) in line]
    publish_screenshots(shots)
    # the page at the widths people use, in both themes, with the chart open and closed: every control on the screen
    for width in (1440, 1280):
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            page.set_viewport_size({"width": width, "height": 900})
            for closed in (False, True):
                if closed:
                    page.locator("#chart-toggle").click()
                    expect(page.locator("#side")).to_be_hidden()
                screenshot(page, f"session-{width}-{scheme}{'-chart-closed' if closed else ''}")
                for control in ("#send-button", "#more-button", "#mode-select", ".attach-button", "#chart-toggle"):
                    found = page.locator(control).bounding_box()
                    assert found is not None and found["x"] >= 0 and found["x"] + found["width"] <= width, control
            page.locator("#chart-toggle").click()
            expect(page.locator("#side")).to_be_visible()
    phone.emulate_media(color_scheme="dark")
    screenshot(phone, "session-390-dark")


def test_a_shared_link_shows_bob_adas_conversation_without_controls_and_bob_copies_it(
    browser: Browser, world: World
) -> None:
    world.model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="Forty lines."))
    ada = browser.page("ada")
    start_session(ada)
    send(ada, "How long are the notes?")
    expect(ada.locator("#turn-1")).to_have_attribute("data-status", "done")
    ada.locator("#share-menu summary").click()
    ada.click("#share-start")
    link = ada.locator("#share-link").input_value()
    assert "/shared/" in link
    bob = browser.page("bob")
    bob.goto(link)
    expect(bob.locator("#turn-1 .reply").last).to_contain_text("Forty lines.")
    expect(bob.locator("#turn-1 .tool summary")).to_contain_text("#0001")
    expect(bob.locator(".chat-head .meta")).to_contain_text("shared by ada")
    expect(bob.locator("#turn-1 .author")).to_have_text("ada")
    for control in ("#composer", "#controls", "button.edit", "button.rewind", ".full-link", "#share-menu"):
        expect(bob.locator(control)).to_have_count(0)
    screenshot(bob, "shared")
    bob.click("#copy-shared")
    expect(bob.locator("#composer")).to_be_visible()
    expect(bob.locator("#session-title")).to_have_text("How long are the notes? (copy)")
    expect(bob.locator("#turn-1 .reply").last).to_contain_text("Forty lines.")
    expect(bob.locator("#turn-1 .author")).to_have_text("You")
    world.model.push(Step(text="Still forty."))
    send(bob, "Sure?")
    expect(bob.locator("#turn-2 .reply").last).to_contain_text("Still forty.")
    ada.click("#share-stop")
    expect(ada.locator("#share-start")).to_be_visible()
    assert bob.request.get(link).status == 404, "a stopped link shows nothing"


def test_pin_and_archive_from_the_list(browser: Browser, world: World) -> None:
    page = browser.page("ada")
    first = start_session(page)
    page.goto(world.url + "/")
    second = start_session(page, mode="plan")  # an empty one with the same settings would be the first again
    page.goto(world.url + "/")
    items = page.locator("#session-list li.session")
    expect(items.first).to_have_attribute("id", f"session-{second}")
    page.locator(f"#session-{first} button.pin").click()
    expect(items.first).to_have_attribute("id", f"session-{first}")
    expect(page.locator(f"#session-{first} .pin-mark")).to_be_visible()
    page.locator(f"#session-{second} button.archive").click()
    expect(page.locator(f"#session-{second}")).to_have_count(0)
    page.click("#show-archived")
    expect(page.locator("h1")).to_have_text("Archived sessions")
    expect(page.locator(f"#session-{second}")).to_be_visible()
    page.locator(f"#session-{second} button.archive").click()
    expect(page.locator(f"#session-{second}")).to_have_count(0)
    page.click("#show-listed")
    expect(items).to_have_count(2)
    screenshot(page, "sessions_pinned")
