"""The layout people know, in Chromium: New chat opens a composer at once and stores the session with its first
message; the sidebar on every page lists the person's sessions, marks the current one, searches, renames, pins,
archives and deletes, folds away (remembered), and is a drawer on a phone."""

from __future__ import annotations

import base64
import io
import json
import re
from typing import Any

import pytest
from PIL import Image
from playwright.sync_api import expect

from sessions_app.models import ChatSession, ModelEndpoint
from testing.scripted_server import Step
from tests.browser.browser_kit import PHONE, Browser, World, in_thread
from tests.browser.test_browser_chat import send, start_session, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)


def sessions_of(name: str) -> list[tuple[int, str]]:
    return list(ChatSession.objects.filter(owner__username=name).order_by("pk").values_list("pk", "title"))


def new_chat(page: Any, world: World, text: str, reply: str, *, workspace: str | None = None) -> int:
    page.locator("#sidebar-new").click()
    page.wait_for_url(world.url + "/sessions/new")
    expect(page.locator("#composer-text")).to_be_focused()
    if workspace is not None:
        page.select_option("select[name=workspace]", label=workspace)
    world.model.push(Step(text=reply))
    page.fill("#composer-text", text)
    page.press("#composer-text", "Enter")
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    expect(page.locator("#turn-1 .reply")).to_have_text(reply)
    wait_idle(page)
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_new_chat_stores_a_session_with_its_first_message_and_the_sidebar_manages_them(
    browser: Browser, world: World
) -> None:
    page = browser.page("ada")
    expect(page.locator("#sidebar")).to_be_visible()
    page.locator("#sidebar-new").click()
    expect(page.locator("select[name=workspace] option:checked")).to_have_text("ada's files")
    page.goto(world.url + "/")
    assert in_thread(sessions_of, "ada") == [], "opening New chat and leaving stores nothing"

    first = new_chat(page, world, "What is in the notes?", "Forty lines.", workspace="demo")
    current = page.locator(f"#side-{first}")
    expect(current).to_have_class(re.compile(r"\bcurrent\b"))
    expect(current.get_by_role("link")).to_have_attribute("aria-current", "page")
    expect(current.get_by_role("link")).to_have_text("What is in the notes?")
    assert "What is in the notes?" in json.loads(world.model.requests[0])["messages"][-1]["content"]

    page.locator("#sidebar-new").click()
    expect(page.locator("select[name=workspace] option:checked")).to_have_text("demo")  # the last session's
    page.go_back()
    second = new_chat(page, world, "Another question", "Another answer.")
    expect(page.locator("#sidebar-list .side-item").first).to_have_id(f"side-{second}")  # newest first

    # pin the older one: it goes on top; rename it; archive the newer; the list is redrawn in place
    older = page.locator(f"#side-{first}")
    older.locator(".item-menu summary").click()
    older.get_by_role("button", name="Pin").click()
    expect(page.locator("#sidebar-list .side-item").first).to_have_id(f"side-{first}")
    older = page.locator(f"#side-{first}")
    older.locator(".item-menu summary").click()
    older.get_by_label(re.compile("New title")).fill("The notes")
    older.get_by_role("button", name="Rename").click()
    expect(page.locator(f"#side-{first} > a")).to_have_text(re.compile("The notes$"))
    newer = page.locator(f"#side-{second}")  # the session on the screen: its heading follows a rename
    newer.locator(".item-menu summary").click()
    newer.get_by_label(re.compile("New title")).fill("Another one")
    newer.get_by_role("button", name="Rename").click()
    expect(page.locator("#session-title")).to_have_text("Another one")
    newer = page.locator(f"#side-{second}")
    newer.locator(".item-menu summary").click()
    newer.get_by_role("button", name="Archive").click()
    expect(page.locator(f"#side-{second}")).to_have_count(0)
    expect(page.locator("#sidebar-list")).to_contain_text("Archived (1)")

    # the search box filters the list as one types, over messages and replies too
    page.locator("#sidebar-q").fill("forty")
    expect(page.locator("#sidebar-list .side-item")).to_have_count(1)
    expect(page.locator("#sidebar-list .side-item > a")).to_contain_text("The notes")
    page.locator("#sidebar-q").fill("")
    expect(page.locator("#sidebar-summary")).to_have_count(0)

    # fold it away: the page keeps the width, and the next page is drawn folded (no jump)
    chat_left = page.locator("#composer-text").bounding_box()["x"]
    page.locator("#sidebar-toggle").click()
    expect(page.locator("#sidebar")).to_be_hidden()
    expect(page.locator("#sidebar-toggle")).to_have_attribute("aria-expanded", "false")
    assert page.locator("#composer-text").bounding_box()["x"] < chat_left
    page.reload()
    expect(page.locator("#sidebar")).to_be_hidden()
    page.locator("#sidebar-toggle").click()
    expect(page.locator("#sidebar")).to_be_visible()

    # deleting the session on the screen leads to the list; it is hidden, not gone
    page.once("dialog", lambda dialog: dialog.accept())
    shown = page.locator(f"#side-{first}")
    page.goto(world.url + f"/sessions/{first}/")
    shown.locator(".item-menu summary").click()
    shown.get_by_role("button", name="Delete").click()
    page.wait_for_url(world.url + "/")
    expect(page.locator(f"#side-{first}")).to_have_count(0)
    assert in_thread(lambda: ChatSession.objects.get(pk=first).deleted_at is not None)
    assert [pk for pk, _ in in_thread(sessions_of, "ada")] == [first, second], "one session per message sent"


def test_on_a_phone_the_sidebar_is_a_drawer(browser: Browser, world: World) -> None:
    page = browser.page("ada", **PHONE)
    first = new_chat_on_phone(page, world)
    expect(page.locator("#sidebar")).to_be_hidden()
    toggle = page.locator("#sidebar-toggle")
    toggle.tap()
    expect(page.locator("#sidebar")).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().x === 0")
    assert page.locator("#sidebar").bounding_box()["width"] <= 390 * 0.85 + 1
    expect(page.locator("#sidebar-new")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#sidebar")).to_be_hidden()
    expect(toggle).to_be_focused()
    toggle.tap()
    page.locator("#sidebar-backdrop").tap(position={"x": 370, "y": 400})
    expect(page.locator("#sidebar")).to_be_hidden()
    toggle.tap()
    page.locator("#sidebar-all").tap()
    page.wait_for_url(world.url + "/")
    expect(page.locator(f"#session-{first}")).to_be_visible()


def new_chat_on_phone(page: Any, world: World) -> int:
    page.goto(world.url + "/sessions/new")
    row = [page.locator(selector).bounding_box() for selector in ("#composer-text", "#start-session")]
    assert all(b is not None and b["x"] >= 0 and b["x"] + b["width"] <= 390 for b in row), row
    world.model.push(Step(text="Hi."))
    page.fill("#composer-text", "Hello from a phone")
    page.select_option("select[name=workspace]", label="demo")
    page.locator("#new-chat-files").set_input_files(
        [{"name": "photo.jpg", "mimeType": "image/jpeg", "buffer": b"x" * 2048}]
    )
    expect(page.locator("#new-chat-attached")).to_have_text("photo.jpg")
    page.locator("#start-session").tap()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    said = json.loads(world.model.requests[-1])["messages"][-1]["content"]
    assert (
        said.endswith(
            "Uploaded: photo.jpg, 2 KB, an image (the model is not shown images; read cannot open one).\n</note>"
        )
        and (world.folder / "photo.jpg").stat().st_size == 2048
    )
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_settings_instructions_and_a_preset_reach_the_model_as_a_note(browser: Browser, world: World) -> None:
    page = browser.page("ada")
    session_id = start_session(page)
    page.locator("#settings-menu summary").click()
    page.get_by_label("Instructions").fill("Answer in French.")
    page.get_by_label("Temperature").fill("0.4")
    page.locator("#settings-preset_name").fill("French")
    page.locator("#preset-save").click()
    expect(page.locator("#settings-said")).to_have_text("Kept as the preset “French”.")
    page.locator("#settings-save").click()
    expect(page.locator("#settings-said")).to_have_text("Saved: they apply from your next message.")
    world.model.push(Step(text="Bonjour."))
    send(page, "Hello")
    expect(page.locator("#turn-1 .reply")).to_have_text("Bonjour.")
    expect(page.locator(f"#side-title-{session_id}")).to_have_text("Hello")  # the first message names it, live
    expect(page.locator("#turn-1 .who .note", has_text="instructions")).to_be_visible()
    sent = json.loads(world.model.requests[-1])
    assert sent["messages"][-1]["content"].endswith("Instructions for this session:\nAnswer in French.\n</note>")
    assert sent["temperature"] == 0.4 and "French" not in sent["messages"][0]["content"]

    # New chat offers the preset: choosing it fills the box
    page.locator("#sidebar-new").click()
    page.get_by_text("Instructions and sampling…").click()
    page.get_by_label("Preset").select_option(label="French")
    expect(page.get_by_label("Instructions")).to_have_value("Answer in French.")
    assert in_thread(lambda: list(ChatSession.objects.filter(owner__username="ada").values_list("pk", flat=True))) == [
        session_id
    ], "New chat stores nothing before its first message"


PASTE = """([selector, kind]) => {
  const data = new DataTransfer();
  data.items.add(new File(["fake png"], "image.png", {type: "image/png"}));
  const target = document.querySelector(selector);
  const event = kind === "paste"
    ? new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true})
    : new DragEvent(kind, {dataTransfer: data, bubbles: true, cancelable: true});
  target.dispatchEvent(event);
}"""


def test_attach_by_button_paste_and_drop_then_the_message_says_what_arrived(browser: Browser, world: World) -> None:
    (world.folder / "notes.md").write_text("the workspace's own\n")
    page = browser.page("ada")
    start_session(page)
    clashing = [{"name": "notes.md", "mimeType": "text/markdown", "buffer": b"attached\n"}]
    page.locator("#attach-input").set_input_files(clashing)
    clash = page.get_by_role("dialog", name="A file of that name is in the workspace")
    expect(clash).to_contain_text("notes.md is already in the workspace.")
    clash.get_by_role("button", name="Don't attach").click()  # the way out the browser's confirm had not
    expect(page.locator("#attachments")).to_contain_text("notes.md was not attached.")
    expect(clash).to_have_count(0)
    page.locator("#attach-input").set_input_files([])
    page.locator("#attach-input").set_input_files(clashing)
    clash.get_by_role("button", name=re.compile(r"^Keep both \(the new one as notes \(2\)\.md\)$")).click()
    expect(page.locator("#attachments .attached-file")).to_have_count(1)
    expect(page.locator("#attachments")).to_contain_text("notes (2).md")
    page.evaluate(PASTE, ["#composer-text", "paste"])
    expect(page.locator("#attachments .attached-file")).to_have_count(2)
    expect(page.locator("#attachments .attached-file").nth(1)).to_contain_text(re.compile(r"pasted-\d{8}-\d{6}\.png"))
    page.evaluate(PASTE, ["#transcript", "dragover"])
    page.evaluate(PASTE, ["#transcript", "drop"])
    expect(page.locator("#attachments .attached-file")).to_have_count(3)
    page.locator("#attachments .attached-file").first.get_by_role("button").click()
    expect(page.locator("#attachments")).to_contain_text("notes (2).md removed.")
    assert not (world.folder / "notes (2).md").exists()
    assert (world.folder / "notes.md").read_text() == "the workspace's own\n"
    world.model.push(Step(text="Got it."))
    send(page, "Here is a screenshot")
    expect(page.locator("#turn-1 .reply")).to_have_text("Got it.")
    expect(page.locator("#attachments .attached-file")).to_have_count(0)
    shown = re.compile(r"^Attached: pasted-\d{8}-\d{6}\.png \(8\xa0bytes\), image\.png \(8\xa0bytes\)$")
    expect(page.locator("#turn-1 .attached-with")).to_have_text(shown)  # the message keeps its files
    page.reload()
    expect(page.locator("#turn-1 .attached-with")).to_have_text(shown)
    said = json.loads(world.model.requests[-1])["messages"][-1]["content"]
    image = r", 8 bytes, an image \(the model is not shown images; read cannot open one\)"
    assert re.search(rf"\n\nUploaded: pasted-\d{{8}}-\d{{6}}\.png{image}; image\.png{image}\.\n</note>$", said)


def test_the_chart_shows_a_card_on_hover_focus_and_click_and_opens_and_closes_from_its_headline(
    browser: Browser, world: World
) -> None:
    world.model.push(Step(text="One."), Step(text="Two."))
    page = browser.page("ada")
    start_session(page)
    send(page, "First")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    send(page, "Second")
    expect(page.locator("#chart .chart-bar")).to_have_count(2)
    expect(page.locator("#cache-chart .tick.threshold-tick")).to_have_text("compacts at 80 %")
    second = page.locator("#chart .chart-bar").nth(1)
    second.hover()
    card = page.locator("#bar-figures")
    expect(card).to_have_class(re.compile(r"\bfloating\b"))
    expect(card.locator(".figures-head")).to_contain_text("Request 2")
    expect(card).to_contain_text("cache miss: not checked")
    plot, shown = page.locator("#cache-chart").bounding_box(), card.bounding_box()
    assert shown["y"] >= plot["y"] + plot["height"], "under the chart, covering none of its bars"
    assert shown["x"] >= 0 and shown["x"] + shown["width"] <= 1400
    expect(card.locator(".figures-row").first.locator(".figures-name")).to_have_text("prompt tokens")
    expect(card.locator(".figures-row").first.locator(".figures-value")).to_have_text(re.compile(r"^[\d,]+$"))
    page.locator("h1").hover()
    expect(card).to_be_empty()
    page.locator("#chart .chart-bar").first.focus()
    expect(card.locator(".figures-head")).to_contain_text("Request 1")
    page.keyboard.press("Escape")
    expect(card).to_be_empty()

    chat_width = page.locator("#conversation").bounding_box()["width"]
    toggle = page.locator("#chart-toggle")
    expect(toggle).to_have_text(re.compile(r"^\s*2 requests · \d+ % cached$"))
    expect(toggle).to_have_attribute("aria-expanded", "true")
    page.locator("#chart-fold > summary").click()
    expect(page.locator("#chart")).to_be_hidden()
    expect(page.locator("#side")).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    talk, body = page.locator("#conversation").bounding_box(), page.locator(".chat-body").bounding_box()
    assert talk["width"] > chat_width, "the talk takes the room"
    assert abs((talk["x"] - body["x"]) - (body["x"] + body["width"] - talk["x"] - talk["width"])) < 2, "centred"
    page.reload()
    expect(page.locator("#chart-fold")).not_to_have_attribute("open", "")
    expect(page.locator("#chart-toggle")).to_have_attribute("aria-expanded", "false")
    page.locator("#chart-toggle").click()
    expect(page.locator("#chart")).to_be_visible()
    expect(page.locator("#chart-toggle")).to_have_attribute("aria-expanded", "true")
    page.reload()
    expect(page.locator("#chart")).to_be_visible()  # open is remembered too


def test_after_the_first_reply_the_model_titles_the_session_in_the_heading_and_the_sidebar(
    browser: Browser, world: World, settings: Any
) -> None:
    settings.CACHET_TITLES = True
    page = browser.page("ada")
    page.locator("#sidebar-new").click()
    page.wait_for_url(world.url + "/sessions/new")
    world.model.push(Step(text="Forty lines."), Step(text="**Notes overview.**"))
    page.fill("#composer-text", "What is in the notes?")
    page.press("#composer-text", "Enter")
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    session_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    expect(page.locator("#turn-1 .reply")).to_have_text("Forty lines.")
    expect(page.locator("#session-title")).to_have_text("Notes overview")  # no reload
    expect(page.locator(f"#side-{session_id} > a")).to_have_text(re.compile("Notes overview$"))
    wait_idle(page)
    expect(page.locator("[id^=turn-]")).to_have_count(1)  # the title's request is no turn
    assert len(world.model.requests) == 2
    page.reload()
    expect(page.locator("#session-title")).to_have_text("Notes overview")


def test_a_model_that_reads_images_is_sent_the_attached_picture_and_the_page_says_so(
    browser: Browser, world: World
) -> None:
    world.model.vision = True  # as llama.cpp started with --mmproj
    in_thread(lambda: ModelEndpoint.objects.filter(pk=world.endpoint.pk).update(reads_images=True))
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(out, format="PNG")
    picture = out.getvalue()
    page = browser.page("ada")
    start_session(page)
    page.locator("#attach-input").set_input_files([{"name": "red.png", "mimeType": "image/png", "buffer": picture}])
    expect(page.locator("#attachments .attached-file")).to_have_count(1)
    world.model.push(Step(text="A red rectangle."))
    send(page, "What is this?")
    expect(page.locator("#turn-1 .reply")).to_have_text("A red rectangle.")
    expect(page.locator("#turn-1 .attached-with")).to_have_text(
        f"Attached: red.png ({len(picture)}\xa0bytes, shown to the model)"
    )
    content = json.loads(world.model.requests[-1])["messages"][-1]["content"]
    assert content[1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(picture).decode()},
    }
    assert content[0]["text"].endswith(
        f"Uploaded: red.png, {len(picture)} bytes, an image, shown with this message.\n</note>"
    )
