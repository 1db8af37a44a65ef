"""The team deployment's files, read as Docker would read them (no Docker engine runs here): the compose
services, their images, settings, volumes, health checks and start order, what the web container needs for
bubblewrap, the Caddy example, and the image's Dockerfile."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
WEB: dict[str, Any] = SERVICES["web"]


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def _settings_env_names() -> set[str]:
    """Every environment variable the settings and ``manage.py serve`` read."""
    sources = [ROOT / "cachet" / "settings.py", ROOT / "chat" / "management" / "commands" / "serve.py"]
    found: set[str] = set()
    for source in sources:
        text = source.read_text()
        found |= set(re.findall(r"""os\.environ(?:\.get)?\(\s*["']([A-Z_]+)["']""", text))
        found |= set(re.findall(r"""os\.environ\[["']([A-Z_]+)["']\]""", text))
        found |= set(re.findall(r"""env_(?:bool|list)\(\s*["']([A-Z_]+)["']""", text))
    return found


def test_the_services_and_their_images() -> None:
    assert set(SERVICES) == {"db", "redis", "web", "worker", "model", "proxy"}
    assert SERVICES["db"]["image"] == "postgres:16"
    assert SERVICES["redis"]["image"] == "redis:7"
    assert WEB["build"] == "."
    assert SERVICES["worker"]["image"] == WEB["image"], "the worker runs the image the web service builds"
    assert SERVICES["model"]["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert SERVICES["proxy"]["image"].startswith("caddy:")


def test_the_model_server_and_the_proxy_are_optional_profiles() -> None:
    assert SERVICES["model"]["profiles"] == ["model"]
    assert SERVICES["proxy"]["profiles"] == ["proxy"]
    for name in ("db", "redis", "web"):
        assert "profiles" not in SERVICES[name], f"{name} must start by default"
    assert "model" not in WEB.get("depends_on", {}), "web must start without the optional model server"


def test_the_web_command_is_manage_py_serve_on_all_interfaces() -> None:
    command = WEB["command"]
    assert command[:3] == ["python", "manage.py", "serve"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "8000"
    assert "--no-worker" in command, "replies run in the worker service"


def test_the_workers_share_the_webs_settings_and_folders_and_start_after_its_migrations() -> None:
    worker = SERVICES["worker"]
    assert worker["command"] == ["python", "manage.py", "worker"]
    assert worker["environment"] == WEB["environment"]
    assert worker["volumes"] == WEB["volumes"]
    assert worker["depends_on"] == {"web": {"condition": "service_healthy"}}
    assert worker["deploy"]["replicas"] == "${CACHET_WORKERS:-1}"


def test_the_web_environment() -> None:
    environment = WEB["environment"]
    expected = {
        "DATABASE_URL",
        "REDIS_URL",
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
        "CACHET_MODEL_URL",
        "CACHET_WORKSPACES",
        "CACHET_TLS",
        "CACHET_PROXY_COUNT",
    }
    assert expected <= set(environment)
    assert "@db:5432/cachet" in environment["DATABASE_URL"]
    assert environment["DATABASE_URL"].startswith("postgres://cachet:")
    assert environment["REDIS_URL"] == "redis://redis:6379/0"
    assert environment["SECRET_KEY"].startswith("${SECRET_KEY:?"), "a missing SECRET_KEY must stop compose"
    assert "127.0.0.1" in environment["ALLOWED_HOSTS"].split(","), "the health check asks as 127.0.0.1"
    assert environment["CACHET_MODEL_URL"] == "${CACHET_MODEL_URL:-}", "unset, staff's endpoint stays as they set it"
    assert environment["CACHET_DEFAULT_MODEL_URL"] == "http://model:8080/v1"
    db = SERVICES["db"]["environment"]
    assert db["POSTGRES_DB"] == "cachet" and db["POSTGRES_USER"] == "cachet"


@pytest.mark.parametrize(
    "name",
    sorted(WEB["environment"]),
)
def test_each_web_setting_is_one_cachet_reads(name: str) -> None:
    assert name in _settings_env_names(), f"docker-compose.yml sets {name}, which Cachet never reads"


def _compose_default(value: str) -> str:
    """What ``${NAME:-default}`` gives where NAME is not set."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return match.group(1) if match else value


def test_the_seeded_workspaces_lie_under_the_workspace_roots(settings: Any) -> None:
    from sessions_app.folders import folder_check

    environment = WEB["environment"]
    roots = _compose_default(environment["CACHET_WORKSPACE_ROOTS"])
    assert roots == "/workspaces"
    settings.CACHET_WORKSPACE_ROOTS = [Path(root) for root in roots.split(",")]
    settings.BASE_DIR, settings.CACHET_DATA, settings.STATIC_ROOT = Path("/app"), Path("/data"), Path("/data/static")
    seeded = [item.split("=", 1)[1] for item in _compose_default(environment["CACHET_WORKSPACES"]).split(",")]
    assert seeded == ["/workspaces/team"]
    assert [folder_check(folder).refusal for folder in seeded] == [""]
    assert folder_check("/data/pg").refusal == "/data/pg lies inside Cachet's data (/data)"


def test_the_volumes_keep_the_data() -> None:
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in WEB["volumes"]}
    assert mounts["/data"] == "cachetdata" and mounts["/workspaces"] == "./workspaces"
    assert "pgdata:/var/lib/postgresql/data" in SERVICES["db"]["volumes"]
    assert "./models:/models:ro" in SERVICES["model"]["volumes"]
    assert {"pgdata", "cachetdata", "caddydata", "caddyconfig"} <= set(COMPOSE["volumes"])


def test_health_checks() -> None:
    assert "pg_isready" in " ".join(SERVICES["db"]["healthcheck"]["test"])
    assert SERVICES["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    web_check = " ".join(WEB["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/login/" in web_check
    assert WEB["healthcheck"]["start_period"]


def test_the_start_order_waits_for_healthy_services() -> None:
    assert WEB["depends_on"] == {"db": {"condition": "service_healthy"}, "redis": {"condition": "service_healthy"}}
    assert SERVICES["proxy"]["depends_on"] == {"web": {"condition": "service_healthy"}}


def test_the_cachet_containers_may_make_bubblewrap_namespaces() -> None:
    for name in ("web", "worker"):  # the worker runs the commands; the web process checks the sandbox at start
        assert set(SERVICES[name]["security_opt"]) == {
            "seccomp=unconfined",
            "apparmor=unconfined",
            "systempaths=unconfined",
        }
        assert "privileged" not in SERVICES[name]
    for name in ("db", "redis", "model", "proxy"):
        assert "security_opt" not in SERVICES[name], f"only Cachet runs commands; {name} keeps Docker's profiles"


def _caddy_site() -> list[str]:
    """The directives of the Caddyfile's ``cachet.lan`` site, one a line, comments dropped."""
    mount = next(volume for volume in SERVICES["proxy"]["volumes"] if volume.endswith("/etc/caddy/Caddyfile:ro"))
    caddyfile = (ROOT / mount.split(":")[0]).read_text()
    site = re.search(r"^cachet\.lan \{\n(.*?)^\}", caddyfile, re.S | re.M)
    assert site is not None
    return [line for line in re.findall(r"^\s*(\S.*)$", site.group(1), re.M) if not line.startswith("#")]


def _proxy_options(site: list[str], upstreams: str) -> list[str]:
    """The options of the site's ``reverse_proxy UPSTREAMS { … }`` block, one a line (nested blocks' too)."""
    opening = site.index(f"reverse_proxy {upstreams} {{")
    depth = 0
    for at, line in enumerate(site[opening:], start=opening):
        depth += line.endswith("{") - (line == "}")
        if depth == 0:
            return site[opening + 1 : at]
    raise AssertionError(f"reverse_proxy {upstreams} is not closed")


def test_the_caddy_example_proxies_to_web_with_internal_tls() -> None:
    site = _caddy_site()
    assert site[0] == "tls internal" and site[-1] == "}" and "reverse_proxy web:8000 {" in site
    assert SERVICES["proxy"]["ports"] == ["80:80", "443:443"]


def _skips_a_web_process_that_is_down(options: list[str]) -> None:
    """Caddy tries another web process (or the same, once back) rather than answer 502, leaves one that failed
    alone, and asks each for a static file (which needs no database: an outage of Postgres marks none down)."""
    assert "lb_try_duration 10s" in options and "fail_duration 30s" in options, options
    assert "health_uri /static/cachet/favicon.svg" in options and "health_interval 5s" in options, options
    assert (ROOT / "static" / "cachet" / "favicon.svg").exists()
    assert "X-Forwarded-Proto https" in options, "else Cachet behind TLS answers the health check with a redirect"


def test_the_caddy_example_skips_a_web_process_that_is_down() -> None:
    _skips_a_web_process_that_is_down(_proxy_options(_caddy_site(), "web:8000"))


def _documented(heading: str) -> str:
    """The text of docs/deployment.md's section ``### HEADING``."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    match = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^##)", text, re.S | re.M)
    assert match is not None, heading
    return match.group(1)


def test_the_documented_caddy_block_for_several_web_processes_skips_one_that_is_down() -> None:
    section = _documented("Web processes and workers")
    block = re.search(r"^```\n(cachet\.lan \{\n.*?^\})\n```", section, re.S | re.M)
    assert block is not None
    site = [line.strip() for line in block.group(1).splitlines()[1:-1]]
    options = _proxy_options(site, "127.0.0.1:8001 127.0.0.1:8002")
    assert "lb_policy least_conn" in options
    _skips_a_web_process_that_is_down(options)


def test_the_https_section_shows_the_caddyfile_as_it_is() -> None:
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    site = re.search(r"^cachet\.lan \{\n.*?^\}", caddyfile, re.S | re.M)
    assert site is not None
    without_comments = "\n".join(line for line in site.group(0).splitlines() if not line.strip().startswith("#"))
    assert f"```\n{without_comments}\n```" in _documented("HTTPS through Caddy")


def test_every_service_is_started_again_when_it_stops() -> None:
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", f"{name} is not started again should it die"


def test_docker_waits_for_a_stopping_worker_longer_than_it_takes() -> None:
    from chat.management.commands.worker import STOP_LIMIT_SECONDS

    for name in ("web", "worker"):
        grace = SERVICES[name]["stop_grace_period"]
        assert grace.endswith("s") and int(grace[:-1]) > STOP_LIMIT_SECONDS, (name, grace)


@pytest.mark.parametrize("unit", ["cachet-web@.service", "cachet-worker@.service"])
def test_the_documented_systemd_units_start_a_process_again_when_it_fails(unit: str) -> None:
    section = _documented("Web processes and workers")
    match = re.search(rf"^```ini\n# {re.escape(unit)}: .*?\n(.*?)^```", section, re.S | re.M)
    assert match is not None, f"docs/deployment.md gives no {unit}"
    lines = match.group(1).splitlines()
    assert "Restart=on-failure" in lines and "KillSignal=SIGTERM" in lines, lines
    command = next(line for line in lines if line.startswith("ExecStart="))
    expected = "manage.py serve --no-worker" if unit.startswith("cachet-web") else "manage.py worker"
    assert f"/.venv/bin/python {expected}" in command, command
    stop = next(line for line in lines if line.startswith("TimeoutStopSec="))
    assert int(stop.split("=")[1]) > 15, "a worker may take 15 s to stop"


def test_the_caddy_example_refuses_bodies_past_cachets_limits(settings: Any) -> None:
    from django.urls import reverse

    units = {"MiB": 1024 * 1024, "KiB": 1024, "B": 1}
    limits = "\n".join(_caddy_site())
    found = re.findall(r"^(@\w+) (.+)\nrequest_body \1 \{\nmax_size (\d+)(MiB|KiB|B)\n\}$", limits, re.M)
    sizes = {matcher: int(number) * units[unit] for _, matcher, number, unit in found}
    path = reverse("session_import")
    attach = f"{reverse('session_new')} {reverse('session_attach', args=[1]).replace('/1/', '/*/')}"
    assert sizes == {
        f"path {path}": settings.CACHET_IMPORT_MAX_BYTES + settings.CACHET_MAX_BODY_BYTES,
        f"path {attach}": settings.CACHET_UPLOAD_MAX_BYTES + settings.CACHET_MAX_BODY_BYTES,
        f"not path {path} {attach}": settings.CACHET_MAX_BODY_BYTES,
    }
    assert limits.index("request_body") < limits.index("reverse_proxy")


def test_the_dockerfile() -> None:
    instructions = _dockerfile()
    keywords = [keyword for keyword, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim-bookworm")
    installs = [args for keyword, args in instructions if keyword == "RUN" and "apt-get install" in args]
    assert installs and {"bubblewrap", "git"} <= set(installs[0].split())
    installed = r"pip install (--\S+ )*'?\.(\[ldap\])?'?(\s|$)"  # Cachet itself, with LDAP's extra
    assert any(keyword == "RUN" and re.search(installed, args) for keyword, args in instructions)
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users and users[-1] == "cachet"
    assert keywords.index("USER") < keywords.index("CMD")
    assert any(keyword == "RUN" and "useradd" in args and "cachet" in args for keyword, args in instructions)
    assert ("EXPOSE", "8000") in instructions
    cmd = next(args for keyword, args in instructions if keyword == "CMD")
    assert cmd.startswith('["python", "manage.py", "serve"')
    assert ("ENV", "PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CACHET_DATA=/data") in instructions


def test_the_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".cachet", ".git"} <= set(ignored)
