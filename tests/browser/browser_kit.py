"""Helpers of the browser tests: running database work off Playwright's thread, logging in, screenshots."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection

from sessions_app.models import ModelEndpoint, Workspace
from testing.scripted_server import ScriptedServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 2}
SCREENSHOTS = Path(__file__).resolve().parent.parent / "screenshots"
PASSWORDS = {"ada": "ada-password-1", "bob": "bob-password-1"}
# Every page reports a content security policy violation as a console error, which fails the test.
REPORT_VIOLATIONS = """
  document.addEventListener("securitypolicyviolation", (event) => {
    console.error("CSP violation: " + event.violatedDirective + " " + (event.blockedURI || "inline")
      + " at " + (event.sourceFile || "?") + ":" + event.lineNumber + " " + (event.sample || ""));
  });
"""
T = TypeVar("T")


def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``function`` in a fresh thread (no event loop there) and return what it returns."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = function(*args, **kwargs)
        except BaseException as error:
            box["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class Launched:
    """A Chromium launched by Playwright's sync API in this thread, kept between tests.

    That API marks its event loop as running in the thread that started it, from its start on, and Django
    refuses the ORM in a thread with a running loop (so does any other asyncio loop, pytest-asyncio's
    included). The mark is taken off as soon as the browser is launched and put back only while a test drives
    the browser; meanwhile Playwright's loop is suspended where it was, as between two of its calls."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self._loop = asyncio.get_running_loop()
        asyncio.events._set_running_loop(None)

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """Playwright's loop marked running in this thread, as its sync API expects, for the time of the block."""
        asyncio.events._set_running_loop(self._loop)
        try:
            yield
        finally:
            asyncio.events._set_running_loop(None)


@dataclass
class World:
    url: str
    model: ScriptedServer
    workspace: Workspace
    endpoint: ModelEndpoint
    folder: Path
    users: dict[str, Any] = field(default_factory=dict)


@dataclass
class Browser:
    """A Chromium with the pages a test opened; every request any page makes is recorded."""

    world: World
    browser: Any
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    contexts: list[Any] = field(default_factory=list)

    def page(self, user: str | None = "ada", **options: Any) -> Any:
        """A page in a fresh context (``options`` go to the context: viewport, color_scheme, …), logged in as
        ``user``; its console errors, page errors and policy violations fail the test."""
        context = self.browser.new_context(**{"viewport": {"width": 1400, "height": 900}, **options})
        context.set_default_timeout(15_000)
        context.add_init_script(REPORT_VIOLATIONS)
        context.on("request", lambda request: self.requests.append(request.url))
        self.contexts.append(context)
        page = context.new_page()
        watch_errors(page, self.errors)
        page.on("websocket", lambda socket: self.requests.append(socket.url))
        if user is not None:
            logged_in(page, self.world, user)
        return page

    def foreign_requests(self) -> list[str]:
        own = re.compile(r"^(https?|wss?)://127\.0\.0\.1:" + self.world.url.rsplit(":", 1)[1] + r"/")
        return [url for url in self.requests if not own.match(url) and not url.startswith(("data:", "about:"))]


def watch_errors(page: Any, errors: list[str]) -> None:
    """Record in ``errors`` what ``page`` logs as an error, throws uncaught, or violates of the policy (the
    context must have :data:`REPORT_VIOLATIONS` as an init script for the last)."""
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda message: errors.append(f"console: {message.text}") if message.type == "error" else None)


def logged_in(page: Any, world: World, user: str) -> None:
    """``page`` on the sessions list, logged in as ``user`` by a session cookie the store makes (a test about
    logging in uses :func:`login`, the form): two page loads fewer for every page a test opens."""
    from django.conf import settings
    from django.test import Client

    def session_key() -> str:
        client = Client()
        client.force_login(world.users[user])
        return str(client.cookies[settings.SESSION_COOKIE_NAME].value)

    key = in_thread(session_key)
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": key, "url": world.url}])
    page.goto(world.url + "/")
    page.wait_for_selector("h1:has-text('Your sessions')")


def login(page: Any, url: str, user: str) -> None:
    """Log in as ``user`` through the login form, as a person does: they land on a message box (New chat)."""
    page.goto(url + "/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORDS[user])
    page.click("button[type=submit]")
    page.wait_for_url(url + "/sessions/new")
    page.wait_for_selector("#composer-text")


def from_more(page: Any, name: str) -> None:
    """Open the composer's More menu and press ``name`` in it (Undo, Regenerate, Compact now)."""
    page.locator("#more-button").click()
    page.locator("#options").get_by_role("button", name=name, exact=True).click()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def publish_screenshots(paths: list[Path]) -> None:
    """Copy ``paths`` into ``$CACHET_SCREENSHOTS_TO`` where it is set: how ``python -m testing.screenshots``
    makes the README's pictures from this scripted session (``readme.png`` becomes ``screenshot.png``)."""
    target = os.environ.get("CACHET_SCREENSHOTS_TO")
    if not target:
        return
    for path in paths:
        shutil.copyfile(path, Path(target) / path.name.replace("readme", "screenshot"))
