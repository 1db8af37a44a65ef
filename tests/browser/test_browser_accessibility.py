"""Every page, in both themes, checked by axe-core (vendored, ``tests/browser/vendor``) against WCAG 2 A and AA:
no serious or critical violation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from sessions_app.models import ChatSession
from sessions_app.services.shares import share_start
from testing.scripted_server import Step
from tests.browser.browser_kit import PHONE, Browser, World, in_thread
from tests.browser.test_browser_chat import send, start_session, wait_idle

AXE = (Path(__file__).parent / "vendor" / "axe-4.14.1.min.js").read_text()
SERIOUS = ("serious", "critical")


def violations(page: Any) -> list[str]:
    """What axe finds on ``page`` as it is now (run through the debugging protocol, which the page's content
    security policy does not govern)."""
    page.evaluate(AXE + "\n;0")
    found = page.evaluate(
        """async () => (await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}}))
             .violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
                                      nodes: v.nodes.slice(0, 8).map((n) => n.target.join(' '))}))"""
    )
    return [
        f"{item['id']} ({item['impact']}): {item['help']} at {item['nodes']}"
        for item in found
        if item["impact"] in SERIOUS
    ]


def test_every_page_in_both_themes_has_no_serious_violation(browser: Browser, world: World) -> None:
    world.model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(text="The notes have **40** lines:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```"),
    )
    page = browser.page("ada")
    session_id = start_session(page)
    send(page, "How long are the notes?")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    ada = world.users["ada"]
    ada.is_staff = ada.is_superuser = True
    in_thread(ada.save, update_fields=["is_staff", "is_superuser"])
    token = in_thread(lambda: share_start(session=ChatSession.objects.get(pk=session_id)).token)
    pages = {
        "session": f"/sessions/{session_id}/",
        "sessions": "/",
        "new session": "/sessions/new",
        "chart": f"/sessions/{session_id}/chart",
        "result": f"/sessions/{session_id}/results/1/",
        "turn": f"/sessions/{session_id}/turns/1/?whole=1",
        "password": "/password/",
        "shared": f"/shared/{token}/",
        "usage": "/usage/",
        "api tokens": "/tokens/",
    }
    admin_pages = {
        "admin": "/admin/",
        "admin, sessions": "/admin/sessions_app/chatsession/",
        "admin, a session": f"/admin/sessions_app/chatsession/{session_id}/change/",
        "admin, requests": "/admin/sessions_app/modelrequest/",
        "admin, an endpoint": "/admin/sessions_app/modelendpoint/add/",
        "admin, usage": "/admin/sessions_app/usageday/",
    }
    found: dict[str, list[str]] = {}
    anonymous = browser.page(None)
    # On the admin's pages axe itself adds a <style> the policy refuses; the admin's own policy is checked in
    # test_browser_security, so here it is bypassed.
    admin = browser.page("ada", bypass_csp=True)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for name, path in pages.items():
            page.goto(world.url + path)
            assert page.url == world.url + path, f"{name} is shown, not a login"
            found[f"{name} ({scheme})"] = violations(page)
        admin.emulate_media(color_scheme=scheme)
        for name, path in admin_pages.items():
            admin.goto(world.url + path)
            assert admin.url == world.url + path, f"{name} is shown, not a login"
            found[f"{name} ({scheme})"] = violations(admin)
        page.goto(world.url + f"/sessions/{session_id}/")
        for menu in ("#settings-menu", "#share-menu", "#export-menu"):
            page.locator(f"{menu} summary").click()
            found[f"session, {menu} open ({scheme})"] = violations(page)
            page.locator(f"{menu} summary").click()
        anonymous.emulate_media(color_scheme=scheme)
        anonymous.goto(world.url + "/login/")
        found[f"login ({scheme})"] = violations(anonymous)
    failing = {name: items for name, items in found.items() if items}
    assert not failing, "\n".join(f"{name}: {item}" for name, items in failing.items() for item in items)


def test_on_a_phone_the_drawer_and_more_have_no_serious_violation(browser: Browser, world: World) -> None:
    world.model.push(Step(text="Hi."))
    page = browser.page("ada", **PHONE)
    session_id = start_session(page)
    send(page, "Hello")
    expect(page.locator("#turn-1")).to_have_attribute("data-status", "done")
    wait_idle(page)
    found: dict[str, list[str]] = {}
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.goto(world.url + f"/sessions/{session_id}/")
        page.locator("#sidebar-toggle").tap()
        expect(page.locator("#sidebar")).to_be_visible()
        found[f"drawer ({scheme})"] = violations(page)
        page.keyboard.press("Escape")
        page.get_by_role("button", name="More").tap()
        found[f"more ({scheme})"] = violations(page)
        page.get_by_role("tab", name="Cache").tap()
        found[f"cache tab ({scheme})"] = violations(page)
    failing = {name: items for name, items in found.items() if items}
    assert not failing, "\n".join(f"{name}: {item}" for name, items in failing.items() for item in items)
