"""Login limits: axes' lockout of a (username, address) pair, the per-address limit on failed logins, the
client's address behind proxies and through the ASGI app, the admin's lockout lists, and changing one's
own password."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone

from cachet.asgi import application
from chat.web import logins as logins_module
from chat.web.logins import client_address, failures_from, lockout_message, throttle_message

pytestmark = pytest.mark.django_db

RIGHT = "ada-password-1"
LOCKED = "Too many failed logins for this account from your address; try again in 15 minutes"


@pytest.fixture(autouse=True)
def _fast_hashes_and_an_empty_cache(settings: Any) -> Any:
    """The limits, not PBKDF2's cost, are under test here (bench/login_bench.py measures the cost)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.CACHET_LOGIN_REFUSAL_DELAY = 0
    cache.clear()
    yield
    cache.clear()


def attempt(client: Client, password: str, *, username: str = "ada", address: str = "10.0.0.1", **extra: Any) -> Any:
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address, **extra)


def fail(client: Client, times: int, **kwargs: Any) -> list[int]:
    return [attempt(client, f"wrong-{n}", **kwargs).status_code for n in range(times)]


def test_ten_failures_lock_the_pair_and_the_right_password_is_refused_with_the_message(
    client: Client, user: Any
) -> None:
    codes = fail(client, 10)
    assert codes[:9] == [200] * 9  # the form again: the password was checked and did not match
    assert codes[9] == 429  # the tenth failure locks
    response = attempt(client, RIGHT)
    html = response.content.decode()
    assert response.status_code == 429
    assert LOCKED in html and "or ask an admin to unlock it." in html
    assert '<a class="brand"' in html and 'name="username"' in html  # Cachet's layout, the form still there
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302
    assert AccessAttempt.objects.get(username="ada").failures_since_start == 10  # refusals do not extend it


def test_another_address_or_another_username_is_not_locked(client: Client, user: Any, other_user: Any) -> None:
    fail(client, 10)
    assert attempt(client, "bob-password-1", username="bob").status_code == 302
    elsewhere = Client()
    assert attempt(elsewhere, RIGHT, address="10.0.0.2").status_code == 302


def test_the_lock_ends_after_the_lockout_period(client: Client, user: Any) -> None:
    fail(client, 10)
    assert attempt(client, RIGHT).status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=15, seconds=1))
    assert attempt(client, RIGHT).status_code == 302


@override_settings(AXES_COOLOFF_TIME=timedelta(milliseconds=1))
def test_a_tiny_cooloff_unlocks_at_once(client: Client, user: Any) -> None:
    fail(client, 10)
    assert attempt(client, RIGHT).status_code == 302


def test_a_success_resets_the_count(client: Client, user: Any) -> None:
    fail(client, 9)
    assert attempt(client, RIGHT).status_code == 302
    client.post("/logout/")
    assert fail(client, 9) == [200] * 9
    assert attempt(client, RIGHT).status_code == 302


def test_an_admin_unlocks_with_the_management_command(client: Client, user: Any) -> None:
    fail(client, 10)
    assert attempt(client, RIGHT).status_code == 429
    call_command("axes_reset_username", "ada", verbosity=0)
    assert attempt(client, RIGHT).status_code == 302


def test_the_admin_login_is_locked_too(client: Client, user: Any) -> None:
    for n in range(10):
        client.post("/admin/login/", {"username": "ada", "password": f"x{n}"}, REMOTE_ADDR="10.0.0.1")
    response = attempt(client, RIGHT)
    assert response.status_code == 429 and LOCKED in response.content.decode()


@override_settings(CACHET_LOGIN_FAILURES=0, AXES_LOCK_OUT_AT_FAILURE=False, CACHET_LOGIN_IP_FAILURES_PER_MINUTE=0)
def test_with_both_limits_off_forty_wrong_then_right_logs_in(client: Client, user: Any) -> None:
    assert set(fail(client, 40)) == {200}
    assert attempt(client, RIGHT).status_code == 302


@override_settings(CACHET_LOGIN_IP_FAILURES_PER_MINUTE=5)
def test_an_address_over_its_failure_limit_is_refused_without_a_password_check(
    client: Client, user: Any, other_user: Any, django_user_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = [attempt(client, "x", username=f"nobody-{n}").status_code for n in range(5)]
    assert codes == [200] * 5
    assert failures_from("10.0.0.1") == 5
    checked: list[str] = []
    real = django_user_model.check_password

    def check_password(self: Any, raw: str) -> bool:
        checked.append(raw)
        return bool(real(self, raw))

    monkeypatch.setattr(django_user_model, "check_password", check_password)
    response = attempt(client, "bob-password-1", username="bob")
    assert response.status_code == 429 and response["Retry-After"] == "60"
    assert throttle_message() in response.content.decode()
    assert checked == []  # refused before any password was looked at
    assert attempt(Client(), RIGHT, address="10.0.0.2").status_code == 302  # other addresses are unaffected
    cache.clear()  # the minute passes
    assert attempt(client, "bob-password-1", username="bob").status_code == 302


def test_the_lockout_message_follows_the_configured_minutes() -> None:
    with override_settings(CACHET_LOGIN_LOCKOUT_MINUTES=1):
        assert "try again in 1 minute or ask" in lockout_message()
    with override_settings(CACHET_LOGIN_LOCKOUT_MINUTES=30):
        assert "try again in 30 minutes or ask" in lockout_message()


def test_forwarded_for_counts_only_with_proxies_configured() -> None:
    factory = RequestFactory()
    spoofed = factory.get("/", REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="6.6.6.6, 192.168.1.7")
    assert client_address(spoofed) == "10.0.0.9"
    with override_settings(CACHET_PROXY_COUNT=1):
        assert client_address(spoofed) == "192.168.1.7"  # the entry the one trusted proxy added
        caddy = factory.get("/", REMOTE_ADDR="172.18.0.5", HTTP_X_FORWARDED_FOR="192.168.1.30")
        assert client_address(caddy) == "192.168.1.30"
        direct = factory.get("/", REMOTE_ADDR="192.168.1.40")
        assert client_address(direct) == "192.168.1.40"
    with override_settings(CACHET_PROXY_COUNT=2):
        assert client_address(spoofed) == "6.6.6.6"


def test_a_locked_pair_behind_a_proxy_is_the_forwarded_address(client: Client, user: Any) -> None:
    with override_settings(CACHET_PROXY_COUNT=1):
        fail(client, 10, address="172.18.0.5", HTTP_X_FORWARDED_FOR="192.168.1.30")
        assert attempt(client, RIGHT, address="172.18.0.5", HTTP_X_FORWARDED_FOR="192.168.1.31").status_code == 302
    assert AccessAttempt.objects.filter(ip_address="192.168.1.30").exists()


async def _asgi_post(
    path: str, body: bytes, *, client: tuple[str, int], headers: list[tuple[bytes, bytes]], method: str = "POST"
) -> Any:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000"), *headers],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": body})
    start = await communicator.receive_output(10)
    await communicator.wait(10)
    return start


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_asgi_app_takes_the_address_from_the_connection_not_from_headers(user: Any) -> None:
    body = b"username=ada&password=wrong"
    headers = [
        (b"content-type", b"application/x-www-form-urlencoded"),
        (b"x-forwarded-for", b"6.6.6.6"),
        (b"cookie", settings.CSRF_COOKIE_NAME.encode() + b"=" + b"a" * 32),
        (b"x-csrftoken", b"a" * 32),
    ]
    start = await _asgi_post("/login/", body, client=("192.168.1.55", 40000), headers=headers)
    assert start["status"] == 200
    attempts = await database_sync_to_async(lambda: list(AccessAttempt.objects.values_list("ip_address", flat=True)))()
    assert attempts == ["192.168.1.55"]
    logged = await database_sync_to_async(lambda: list(AccessFailureLog.objects.values_list("ip_address", flat=True)))()
    assert logged == ["192.168.1.55"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_refused_login_is_answered_late_without_holding_up_anyone(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.CACHET_LOGIN_REFUSAL_DELAY = 0.5
    page_answered = asyncio.Event()
    delays: list[float] = []

    async def sleep(seconds: float) -> None:  # the refusal's wait on the event loop lasts until the page is answered
        delays.append(seconds)
        await asyncio.wait_for(page_answered.wait(), 30)

    class Asyncio:  # asyncio as chat.web.logins sees it
        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

    proxy = Asyncio()
    proxy.sleep = sleep  # type: ignore[attr-defined]
    monkeypatch.setattr(logins_module, "asyncio", proxy)
    settings.CACHET_LOGIN_IP_FAILURES_PER_MINUTE = 1
    await database_sync_to_async(cache.set)("cachet:login-failures:192.168.1.66", 1, 60)
    token = [(b"cookie", settings.CSRF_COOKIE_NAME.encode() + b"=" + b"a" * 32), (b"x-csrftoken", b"a" * 32)]
    form = [(b"content-type", b"application/x-www-form-urlencoded"), *token]
    finished: list[str] = []

    async def refused() -> Any:
        start = await _asgi_post("/login/", b"username=x&password=y", client=("192.168.1.66", 1), headers=form)
        finished.append("refused")
        return start

    async def page() -> Any:
        start = await _asgi_post("/login/", b"", client=("192.168.1.67", 1), headers=[], method="GET")
        finished.append("page")
        page_answered.set()
        return start

    refusal, other = await asyncio.gather(refused(), page())
    assert refusal["status"] == 429 and other["status"] == 200
    assert delays == [0.5], "the refusal waited the configured delay, asleep on the event loop"
    assert finished == ["page", "refused"]  # the other person's page did not wait for the refusal


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    root = django_user_model.objects.create_superuser(username="root", password="root-password-1", email="")
    client = Client()
    client.force_login(root)
    return client


def test_the_admin_lists_lockouts_and_failures_read_only(client: Client, user: Any, staff: Client) -> None:
    fail(client, 10)
    for page in ("/admin/axes/accessattempt/", "/admin/axes/accessfailurelog/", "/admin/axes/accesslog/"):
        response = staff.get(page)
        assert response.status_code == 200, page
    listing = staff.get("/admin/axes/accessattempt/").content.decode()
    assert "ada" in listing and "10.0.0.1" in listing and "Locked Out" in listing
    assert staff.get("/admin/axes/accessattempt/add/").status_code == 403
    attempt_row = AccessAttempt.objects.get()
    change = staff.get(f"/admin/axes/accessattempt/{attempt_row.pk}/change/").content.decode()
    assert 'name="username"' not in change  # shown, not editable
    staff.post(f"/admin/axes/accessattempt/{attempt_row.pk}/delete/", {"post": "yes"})
    assert attempt(client, RIGHT).status_code == 302  # deleting the row is the unlock


def test_the_lockout_lists_are_staff_only(client: Client, user: Any) -> None:
    client.force_login(user)
    response = client.get("/admin/axes/accessattempt/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_a_person_changes_their_own_password(client: Client, user: Any) -> None:
    assert attempt(client, RIGHT).status_code == 302
    home = client.get("/").content.decode()
    assert 'href="/password/"' in home and home.index('id="password-link"') < home.index('id="logout"')
    form = client.get("/password/")
    assert form.status_code == 200 and 'name="old_password"' in form.content.decode()
    wrong = client.post(
        "/password/", {"old_password": "nope", "new_password1": "a-new-pass-77", "new_password2": "a-new-pass-77"}
    )
    assert wrong.status_code == 200 and "Your old password was entered incorrectly" in wrong.content.decode()
    done = client.post(
        "/password/", {"old_password": RIGHT, "new_password1": "a-new-pass-77", "new_password2": "a-new-pass-77"}
    )
    assert done.status_code == 302 and done["Location"] == "/password/done/"
    assert "Password changed" in client.get("/password/done/").content.decode()
    assert client.get("/").status_code == 200  # still logged in here
    client.post("/logout/")
    assert attempt(client, RIGHT).status_code == 200  # the old password stops working
    assert attempt(client, "a-new-pass-77").status_code == 302
    user.refresh_from_db()
    assert not user.is_staff


def test_a_weak_new_password_is_refused_with_the_reason(client: Client, user: Any) -> None:
    client.force_login(user)
    response = client.post("/password/", {"old_password": RIGHT, "new_password1": "123", "new_password2": "123"})
    html = response.content.decode()
    assert response.status_code == 200 and "This password is too short" in html
    assert client.login(username="ada", password=RIGHT)


@pytest.mark.parametrize("path", ["/password/", "/password/done/"])
def test_changing_a_password_needs_a_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login/")
