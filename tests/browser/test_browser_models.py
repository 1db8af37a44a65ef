"""Models in the browser: a new session offers each endpoint's models, and a session moves to another model
from its header; the chart marks the next request as a model change."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sessions_app.models import ChatSession, ModelEndpoint
from testing.scripted_server import ScriptedServer, Step
from tests.browser.browser_kit import Browser, World, in_thread, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)


def test_switch_the_model_on_the_page_and_the_chart_marks_the_change(browser: Browser, world: World) -> None:
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as other:
        endpoint = in_thread(
            lambda: ModelEndpoint.objects.create(name="other", base_url=other.base_url, context_window=32768)
        )
        page = browser.page("ada")
        page.click("#new-session")
        groups = page.locator("select[name=endpoint] optgroup")
        expect(groups).to_have_count(2)
        expect(page.locator(f"select[name=endpoint] option[value='{endpoint.pk}:beta']")).to_have_count(1)
        world.model.push(Step(text="One."))
        page.fill("#composer-text", "First")
        page.click("#start-session")
        page.wait_for_url(re.compile(r"/sessions/\d+/$"))
        session_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        expect(page.locator("#model-control .model-name")).to_have_text("scripted")
        expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
        expect(page.locator("#chart .chart-bar")).to_have_count(1)
        expect(page.locator("#chart .axis-titles span").first).to_contain_text("8,192 token window")

        page.click("#model-control summary")
        menu = page.locator("#model-form select[name=endpoint]")
        expect(menu.locator("option:checked")).to_have_text("scripted")
        menu.select_option(f"{endpoint.pk}:beta")
        screenshot(page, "model-menu")
        page.click("#model-use")
        expect(page.locator("#model-control .model-name")).to_have_text("beta")
        expect(page.locator("#notice")).to_contain_text(
            "The model is now beta: the next request reads the conversation again."
        )
        expect(page.locator("#chart .axis-titles span").first).to_contain_text("32,768 token window")

        other.push(Step(text="Two, from beta."))
        page.fill("#composer-text", "Second")
        page.press("#composer-text", "Enter")
        expect(page.locator("#turn-2")).to_have_attribute("data-status", "done")
        bars = page.locator("#chart .chart-bar")
        expect(bars).to_have_count(2)
        expect(bars.nth(1).locator(".cause")).to_have_attribute("title", "model change")
        expect(bars.nth(1).locator(".cause")).to_have_text("M")
        expect(bars.nth(1).locator("g.bar")).to_have_attribute("data-cause", "model_change")
        screenshot(page, "model-change")
        assert len(other.requests) == 1 and len(world.model.requests) == 1
    session = in_thread(lambda: ChatSession.objects.select_related("endpoint").get(pk=session_id))
    assert (session.endpoint.name, session.model_name) == ("other", "beta")


def test_an_endpoint_closed_to_everyone_is_offered_to_its_group_only_and_a_grant_taken_back_keeps_the_words(
    browser: Browser, world: World
) -> None:
    from django.contrib.auth.models import Group

    from chat.tools import tool_list
    from sessions_app.services.sessions import session_start

    def close() -> tuple[ModelEndpoint, int]:
        paid = ModelEndpoint.objects.create(
            name="paid", base_url=world.model.base_url, model="scripted", open_to_everyone=False
        )
        team = Group.objects.create(name="paid-api")
        paid.groups.add(team)
        world.users["ada"].groups.add(team)
        session = session_start(
            owner=world.users["ada"],
            workspace=world.workspace,
            endpoint=paid,
            model_name="scripted",
            tools=tool_list(allow_commands=False),
        )
        return paid, session.pk

    paid, session_id = in_thread(close)
    bob = browser.page("bob")
    bob.goto(world.url + "/sessions/new")
    expect(bob.locator("select[name=endpoint] optgroup")).to_have_count(1)
    expect(bob.locator(f"select[name=endpoint] option[value^='{paid.pk}:']")).to_have_count(0)
    ada = browser.page("ada")
    ada.goto(world.url + "/sessions/new")
    expect(ada.locator(f"select[name=endpoint] option[value='{paid.pk}:scripted']")).to_have_count(1)

    in_thread(lambda: world.users["ada"].groups.clear())
    ada.goto(world.url + f"/sessions/{session_id}/")
    ada.wait_for_load_state("domcontentloaded")
    expect(ada.locator("#ws-status")).to_have_attribute("data-state", "open")
    ada.fill("#composer-text", "Still on the paid one?")
    ada.press("#composer-text", "Enter")
    expect(ada.locator("#notice")).to_contain_text("You may no longer use the model endpoint “paid”")
    expect(ada.locator("#composer-text")).to_have_value("Still on the paid one?")
    assert len(world.model.requests) == 0
