"""API tokens as people meet them: one opened from the header, made, copied and seen once, used against the live
server's API, and revoked in the browser; on a phone the page is reachable and fits the screen."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.browser_kit import PHONE, Browser, World
from tests.browser.test_browser_accessibility import violations
from tests.browser.test_browser_reading import clipboard

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NARROW = {**PHONE, "viewport": {"width": 360, "height": 740}}


def me(world: World, secret: str) -> httpx.Response:
    return httpx.get(world.url + "/api/v1/me", headers={"Authorization": f"Bearer {secret}"}, timeout=15)


def within(element: Any, width: int) -> bool:
    shown = element.bounding_box()
    return shown is not None and shown["x"] >= 0 and shown["x"] + shown["width"] <= width


def make_token(page: Any, name: str, access: str) -> str:
    """Make a token on the tokens page; the secret it shows."""
    page.get_by_label("Name").fill(name)
    page.get_by_label(access).check()
    page.get_by_role("button", name="Make token").click()
    expect(page.locator("#token-made")).to_contain_text("Copy it now: it is not shown again.")
    return str(page.locator("#token-secret").inner_text())


def test_a_token_is_made_seen_once_used_and_revoked_in_the_browser(browser: Browser, world: World) -> None:
    page = browser.page("ada")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=world.url)
    page.locator("#tokens-link").click()
    expect(page.locator("h1")).to_have_text("API tokens")
    expect(page.locator("#tokens-none")).to_be_visible()
    expect(page.get_by_label("read-only")).to_be_checked()

    secret = make_token(page, "my editor", "read-write")

    assert secret.startswith("cachet_") and len(secret) > 40
    assert page.url == world.url + "/tokens/", "the secret is in no address"
    command = f'curl -H "Authorization: Bearer {secret}" {world.url}/api/v1/me'
    expect(page.locator("#token-example")).to_have_text(command)
    page.locator("#token-copy").click()
    expect(page.locator("#token-copy")).to_have_text("Copied")
    assert clipboard(page) == secret
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert violations(page) == [], f"the new token's box ({scheme})"
    answer = me(world, secret)
    assert answer.status_code == 200
    assert answer.json()["username"] == "ada"
    assert answer.json()["token"] == {"name": "my editor", "access": "write"}

    page.locator("#tokens-link").click()
    expect(page.locator("#token-secret")).to_have_count(0)
    assert secret not in page.content(), "shown once: the page after holds only its first characters"
    row = page.locator("#tokens .token").filter(has_text="my editor")
    expect(row).to_contain_text("read-write")
    expect(row).to_contain_text(secret[:12] + "…")
    expect(row).not_to_contain_text("never")  # used just now

    row.get_by_role("button", name="Revoke").click()
    expect(row).to_contain_text("Revoked")
    expect(row.get_by_role("button", name="Revoke")).to_have_count(0)
    assert page.url == world.url + "/tokens/"
    assert me(world, secret).status_code == 401


def test_on_a_phone_tokens_are_in_the_drawer_and_the_page_fits(browser: Browser, world: World) -> None:
    phone = browser.page("ada", **NARROW)
    expect(phone.locator("#tokens-link")).to_be_hidden()  # the header keeps to one line: the drawer has it
    phone.locator("#sidebar-toggle").click()
    phone.locator("#sidebar-tokens").click()
    expect(phone.locator("h1")).to_have_text("API tokens")

    secret = make_token(phone, "phone script", "read-only")

    assert within(phone.locator("#token-copy"), 360)
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "nothing wider than a phone"
    assert me(world, secret).json()["token"] == {"name": "phone script", "access": "read"}
    phone.goto(world.url + "/tokens/")
    expect(phone.locator("#tokens .token")).to_have_count(1)
    assert within(phone.get_by_role("button", name="Revoke"), 360)
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "nothing wider than a phone"

    desk = browser.page("ada")
    expect(desk.locator("#tokens-link")).to_be_visible()
    expect(desk.locator("#sidebar-tokens")).to_be_hidden()
