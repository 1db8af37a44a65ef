"""Branches in Chromium: Edit in place, ◀ n / m ▶ between branches, Regenerate as a sibling, and turns
labelled by their place in the live branch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import expect

from sessions_app.models import BreakCause, ModelRequest
from testing.scripted_server import Step
from tests.browser.browser_kit import Browser, World, from_more, in_thread, screenshot
from tests.browser.test_browser_chat import send, start_session, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)


def last_request(world: World) -> list[dict[str, Any]]:
    """The messages of the last request the scripted server received, after the system prompt."""
    messages: list[dict[str, Any]] = json.loads(world.model.requests[-1])["messages"]
    assert messages[0]["role"] == "system"
    return messages[1:]


def last_cause(session_id: int) -> str:
    return str(in_thread(lambda: ModelRequest.objects.filter(session_id=session_id).order_by("-id")[0].break_cause))


def say(page: Any, number: int, words: str) -> None:
    send(page, words)
    expect(page.locator(f"#turn-{number}")).to_have_attribute("data-status", "done")
    wait_idle(page)


def labels(page: Any) -> list[str]:
    return [text.strip() for text in page.locator("#transcript article .turn-no").all_inner_texts()]


def test_edit_a_first_turn_then_flip_back_and_go_on_from_that_branch(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Answer one."), Step(text="Answer two."), Step(text="Answer three."))
    page = browser.page("ada")
    session_id = start_session(page)
    for number, words in enumerate(["First question", "Second question", "Third question"], start=1):
        say(page, number, words)
    page.locator("#turn-1").get_by_role("button", name="Edit", exact=True).click()
    box = page.locator("#turn-1 textarea.edit-text")
    expect(box).to_have_value("First question")
    expect(page.locator("#turn-1 .words")).to_be_hidden()
    world.model.push(Step(text="Answer one, rephrased."))
    box.fill("First question, rephrased")
    screenshot(page, "branch-editing")
    page.locator("#turn-1").get_by_role("button", name="Save", exact=True).click()
    expect(page.locator("#turn-4")).to_have_attribute("data-status", "done")
    wait_idle(page)
    expect(page.locator("#transcript article")).to_have_count(1)
    expect(page.locator("#turn-4 .words")).to_have_text("First question, rephrased")
    expect(page.locator("#turn-4 .siblings")).to_have_text("◀ 2 / 2 ▶")
    assert labels(page) == ["turn 1"]
    sent = last_request(world)
    assert [m["role"] for m in sent] == ["user"] and sent[0]["content"].startswith("First question, rephrased")
    assert last_cause(session_id) == BreakCause.BRANCH
    screenshot(page, "branch-edited")
    # flip back: the first branch is the live one again, whole
    page.locator("#turn-4 .siblings").get_by_role("button", name="◀").click()
    expect(page.locator("#turn-3")).to_be_visible()
    expect(page.locator("#turn-4")).to_have_count(0)
    expect(page.locator("#turn-1 .siblings")).to_have_text("◀ 1 / 2 ▶")
    expect(page.locator("#turn-3 .reply")).to_have_text("Answer three.")
    assert labels(page) == ["turn 1", "turn 2", "turn 3"]
    wait_idle(page)
    world.model.push(Step(text="Answer four."))
    say(page, 5, "Fourth question")
    sent = last_request(world)
    assert [m["content"] for m in sent if m["role"] == "assistant"] == ["Answer one.", "Answer two.", "Answer three."]
    assert sent[0]["content"].startswith("First question") and "rephrased" not in sent[0]["content"]
    assert sent[-1]["content"].startswith("Fourth question")
    assert last_cause(session_id) == BreakCause.BRANCH
    assert labels(page) == ["turn 1", "turn 2", "turn 3", "turn 4"]
    assert browser.errors == []


def test_regenerate_adds_a_sibling_and_labels_follow_the_live_branch(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Answer one."), Step(text="Answer two."), Step(text="Answer three."))
    page = browser.page("ada")
    start_session(page)
    for number, words in enumerate(["First question", "Second question", "Third question"], start=1):
        say(page, number, words)
    from_more(page, "Undo")
    expect(page.locator("#turn-3")).to_have_count(0)
    wait_idle(page)
    world.model.push(Step(text="Answer two, again."))
    from_more(page, "Regenerate")
    expect(page.locator("#turn-4")).to_have_attribute("data-status", "done")
    wait_idle(page)
    expect(page.locator("#turn-2")).to_have_count(0)
    expect(page.locator("#turn-4 .siblings")).to_have_text("◀ 2 / 2 ▶")
    expect(page.locator("#turn-4 .reply")).to_have_text("Answer two, again.")
    expect(page.locator("#turn-4 .turn-no")).to_have_attribute("title", "Stored as turn 4")
    world.model.push(Step(text="Answer three, anew."))
    say(page, 5, "Third question, anew")
    assert labels(page) == ["turn 1", "turn 2", "turn 3"]
    screenshot(page, "branch-regenerated")
    # flipping shows the first reply again, and the turns after it on that branch (none: the third was undone)
    page.locator("#turn-4 .siblings").get_by_role("button", name="◀").click()
    expect(page.locator("#turn-2 .reply")).to_have_text("Answer two.")
    expect(page.locator("#turn-2 .siblings")).to_have_text("◀ 1 / 2 ▶")
    expect(page.locator("#turn-4")).to_have_count(0)
    expect(page.locator("#turn-5")).to_have_count(0)
    assert labels(page) == ["turn 1", "turn 2"]
    wait_idle(page)
    page.locator("#turn-2 .siblings").get_by_role("button", name="▶").click()
    expect(page.locator("#turn-5 .reply")).to_have_text("Answer three, anew.")
    assert labels(page) == ["turn 1", "turn 2", "turn 3"]
    assert browser.errors == []


def test_regenerate_on_any_reply_branches_from_its_turn_the_last_is_asked_again_and_a_rating_is_kept(
    browser: Browser, world: World
) -> None:
    world.model.push(Step(text="Answer one."), Step(text="Answer two."))
    page = browser.page("ada")
    start_session(page)
    say(page, 1, "First question")
    say(page, 2, "Second question")
    regenerate = page.locator("#turn-1 .msg.model button.regenerate-turn")
    assert regenerate.evaluate("button => getComputedStyle(button.parentElement).opacity") == "0", "shown on hover"
    page.locator("#turn-1 .msg.model").hover()
    expect(regenerate).to_have_css("opacity", "1")
    world.model.push(Step(text="Answer one, again."))
    regenerate.click()
    expect(page.locator("#turn-3")).to_have_attribute("data-status", "done")
    wait_idle(page)
    expect(page.locator("#turn-3 .siblings")).to_have_text("◀ 2 / 2 ▶")
    expect(page.locator("#turn-1")).to_have_count(0)
    expect(page.locator("#turn-2")).to_have_count(0)
    assert labels(page) == ["turn 1"]
    sent = last_request(world)
    assert [m["role"] for m in sent] == ["user"] and sent[0]["content"].startswith("First question")
    world.model.push(Step(text="Answer one, a third time."))
    page.locator("#turn-3 .msg.model").hover()
    page.locator("#turn-3 button.regenerate-turn").click()
    expect(page.locator("#turn-4")).to_have_attribute("data-status", "done")
    expect(page.locator("#turn-4 .siblings")).to_have_text("◀ 3 / 3 ▶")
    again = last_request(world)
    assert again[0]["content"] == sent[0]["content"], "the last reply asked again with its message as it was"
    wait_idle(page)
    page.locator("#turn-4 .msg.model").hover()
    page.locator("#turn-4").get_by_role("button", name="Good reply").click()
    expect(page.locator("#turn-4").get_by_role("button", name="Good reply")).to_have_attribute("aria-pressed", "true")
    page.reload()
    page.locator("h1").hover()
    thumbs = page.locator("#turn-4").get_by_role("button", name="Good reply")
    expect(thumbs).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#turn-4 .reply-tools")).to_have_css("opacity", "1")  # a rated reply shows its rating
    assert browser.errors == []
