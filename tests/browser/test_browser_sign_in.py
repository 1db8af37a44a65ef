"""Signing in with an OpenID Connect provider as a person meets it, in Chromium: the login page's button, the
provider's own page (oidc-provider-mock, running on this machine), and back in Cachet logged in, with the
account, groups and staff status the provider's claims give; a sign-in refused at the provider back on the login
page with why; a provider that is away a page that says so, with the way back to the login page."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from oidc_provider_mock import run_server_in_thread
from playwright.sync_api import expect

from sessions_app.models import DirectoryAccount
from tests.browser.browser_kit import PHONE, Browser, World, in_thread
from tests.browser.test_browser_accessibility import violations
from tests.cachet.test_directory_oidc import CAROL, turn_on

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)

# The provider's pages ask a CDN for their stylesheet: answered empty here, so nothing leaves this machine.
CDN = "https://cdn.jsdelivr.net/"
BUTTON = "Sign in with Example SSO"
AWAY = "The sign-in provider did not answer"


@dataclass
class Provider:
    url: str
    stop: Any  # the provider stops answering (its port closed) when called


@pytest.fixture
def provider(browser: Browser, settings: Any) -> Iterator[Provider]:
    """A provider on this machine and Cachet's sign-in with it on; its pages (and their CDN's) are the requests
    the browser may make away from Cachet."""
    with contextlib.ExitStack() as running:
        server = running.enter_context(run_server_in_thread())
        issuer = f"http://localhost:{server.server_port}"
        turn_on(settings, issuer)
        yield Provider(issuer, running.close)
    browser.requests[:] = [url for url in browser.requests if not url.startswith((issuer + "/", CDN))]


def person(browser: Browser, **options: Any) -> Any:
    """A page of someone not logged in."""
    page = browser.page(None, **options)
    page.context.route(CDN + "**", lambda route: route.fulfill(status=200, content_type="text/css", body=""))
    return page


def to_provider(page: Any, provider: Provider) -> None:
    """From the login page, the button: the provider's page, asking who signs in."""
    button = page.get_by_role("link", name=BUTTON)
    expect(button).to_be_visible()
    button.click()
    expect(page).to_have_url(re.compile(re.escape(f"{provider.url}/oauth2/authorize?")))
    expect(page.get_by_role("heading", name="Authorize Client")).to_be_visible()


def account(username: str) -> tuple[bool, list[str], str, str]:
    """``username``'s staff status, groups, and the directory and subject their account is known by."""

    def read() -> tuple[bool, list[str], str, str]:
        user = User.objects.get(username=username)
        known = DirectoryAccount.objects.get(user=user)
        return user.is_staff, sorted(user.groups.values_list("name", flat=True)), known.source, known.subject

    return in_thread(read)


def test_a_person_signs_in_at_the_provider_and_comes_back_logged_in(
    browser: Browser, world: World, provider: Provider
) -> None:
    assert httpx.put(f"{provider.url}/users/carol-sub", json=CAROL).status_code == 204
    page = person(browser)
    page.goto(world.url + "/usage/")
    expect(page).to_have_url(world.url + "/login/?next=/usage/")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert violations(page) == [], f"the login page with the provider's button ({scheme})"
    to_provider(page, provider)
    page.locator("input[name=sub]").fill("carol-sub")
    page.get_by_role("button", name="Authorize").click()

    page.wait_for_url(world.url + "/usage/")  # where the person was going
    expect(page.locator("h1")).to_have_text("Usage of everyone")  # staff see everyone's
    header = page.locator("header.top")
    expect(header.locator(".who")).to_have_text("carol")
    expect(header.get_by_role("button", name="Log out")).to_be_visible()
    expect(header.get_by_role("link", name="Admin")).to_be_visible()  # staff: the provider says admins
    assert account("carol") == (True, ["Admins", "Engineering"], "oidc", "carol-sub")

    phone = person(browser, **PHONE)  # again, on a phone, from the login page itself: the New chat page
    phone.goto(world.url + "/login/")
    to_provider(phone, provider)
    phone.locator("input[name=sub]").fill("carol-sub")
    phone.get_by_role("button", name="Authorize").click()
    phone.wait_for_url(world.url + "/sessions/new")
    expect(phone.locator("#composer-text")).to_be_visible()
    assert in_thread(User.objects.filter(username__startswith="carol").count) == 1, "the same account"


def test_a_sign_in_refused_at_the_provider_is_back_on_the_login_page_with_why(
    browser: Browser, world: World, provider: Provider
) -> None:
    page = person(browser)
    page.goto(world.url + "/login/")
    to_provider(page, provider)
    page.get_by_role("button", name="Deny").click()

    page.wait_for_url(world.url + "/login/")
    expect(page.get_by_role("alert")).to_have_text("Signing in with Example SSO was cancelled or refused there.")
    expect(page.get_by_role("link", name=BUTTON)).to_be_visible()  # to try again
    expect(page.get_by_role("button", name="Log out")).to_have_count(0)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert violations(page) == [], f"the login page with the refusal ({scheme})"
    page.goto(world.url + "/usage/")
    expect(page).to_have_url(world.url + "/login/?next=/usage/")
    expect(page.get_by_role("alert")).to_have_count(0)  # said once
    assert not in_thread(User.objects.filter(username__startswith="carol").exists)


def away_page(page: Any, browser: Browser, world: World) -> None:
    """The page a provider that is away gets: what happened, and the way back to the login page."""
    expect(page).to_have_title(f"{AWAY} · Cachet")
    expect(page.locator("h1")).to_have_text(AWAY)
    expect(page.get_by_role("alert")).to_contain_text("Cachet could not reach Example SSO")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert violations(page) == [], f"the page of a provider that is away ({scheme})"
    assert browser.errors == [
        "console: Failed to load resource: the server responded with a status of 503 (Service Unavailable)"
    ]
    browser.errors.clear()  # the page's own status
    page.get_by_role("link", name="Back to the login page").click()
    expect(page).to_have_url(world.url + "/login/")
    expect(page.get_by_role("link", name=BUTTON)).to_be_visible()
    expect(page.get_by_role("button", name="Log out")).to_have_count(0)


def test_a_provider_gone_after_the_person_reached_it_gets_a_page_not_a_500(
    browser: Browser, world: World, provider: Provider
) -> None:
    assert httpx.put(f"{provider.url}/users/carol-sub", json=CAROL).status_code == 204
    page = person(browser)
    page.goto(world.url + "/login/")
    to_provider(page, provider)
    page.locator("input[name=sub]").fill("carol-sub")

    def answer_then_stop(route: Any) -> None:
        """The provider's answer (off back to Cachet with a code), and then the provider is gone: Cachet cannot
        trade the code for a token."""
        answered = route.fetch(max_redirects=0)
        provider.stop()
        route.fulfill(response=answered)

    page.route(f"{provider.url}/oauth2/authorize?**", answer_then_stop)
    with page.expect_response(lambda response: response.url.startswith(world.url + "/oidc/callback/")) as back:
        page.get_by_role("button", name="Authorize").click()
    assert back.value.status == 503
    away_page(page, browser, world)
    assert not in_thread(User.objects.filter(username__startswith="carol").exists)


def test_a_provider_that_never_answers_gets_a_page_at_the_button(browser: Browser, world: World, settings: Any) -> None:
    with socket.socket() as closed:  # a port where nothing listens
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    turn_on(settings, f"http://127.0.0.1:{port}")
    page = person(browser)
    page.goto(world.url + "/login/")
    with page.expect_response(lambda response: response.url.startswith(world.url + "/oidc/login/")) as answer:
        page.get_by_role("link", name=BUTTON).click()
    assert answer.value.status == 503
    away_page(page, browser, world)
