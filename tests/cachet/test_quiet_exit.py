"""A process that stops says nothing false about its channel layer: ``manage.py ask`` on the embedded default
(which starts the embedded Postgres and stops it as it exits) ends without a line about a lost connection."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from testing.scripted_server import ScriptedServer, Step

ROOT = Path(settings.BASE_DIR)


@pytest.fixture
def embedded_default() -> Iterator[dict[str, str]]:
    """The environment of a Cachet on an embedded Postgres of its own, migrated, with the user ada. Not under
    pytest's tmp folder: as root, Postgres runs as the ``pgserver`` user, which must traverse the folders above
    its data."""
    folder = Path(tempfile.mkdtemp(prefix="cachet-quiet-exit-"))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "CACHET_CHANNEL_LAYER", "PYTEST_CURRENT_TEST", "DEBUG"}
    }
    env.update(
        CACHET_DATA=str(folder / "data"),
        DJANGO_SETTINGS_MODULE="cachet.settings",
        SECRET_KEY="cachet-quiet-exit-test-secret-key-not-for-production-0123456789",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    (folder / "ws").mkdir()
    env["CACHET_TEST_FOLDER"] = str(folder / "ws")
    try:
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=240)
        made = "from django.contrib.auth.models import User; User.objects.create_user(username='ada')"
        subprocess.run([*manage, "shell", "-c", made], cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
        yield env
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_ask_on_the_embedded_default_ends_without_a_word_about_the_channel_layer(
    embedded_default: dict[str, str],
) -> None:
    """Its exit stops the embedded Postgres under the layer's connection: it used to end its standard error with
    "the channel layer lost its connection to Postgres (…); connecting again"."""
    with ScriptedServer(model="scripted", when_empty=Step(text="hello there")) as model:
        command = ["manage.py", "ask", "--user", "ada", "--endpoint", model.base_url, "hi"]
        command += ["--workspace", embedded_default["CACHET_TEST_FOLDER"]]
        done = subprocess.run(
            [sys.executable, *command], cwd=ROOT, env=embedded_default, capture_output=True, text=True, timeout=180
        )
    assert done.stdout.rstrip().splitlines()[-1].startswith("session=1 "), done.stdout + done.stderr
    assert "channel layer" not in done.stderr, done.stderr
    assert "connection to Postgres" not in done.stderr, done.stderr
