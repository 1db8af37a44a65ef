"""Cachet's settings: all from the environment, with defaults for one person on their own machine."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.utils.functional import lazy

from cachet import embedded_pg
from cachet.cookies import cookie_names

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


CACHET_DATA = Path(os.environ.get("CACHET_DATA") or BASE_DIR / ".cachet").resolve()


@functools.cache
def _generated_secret_key() -> str:
    """The key in ``$CACHET_DATA/secret_key``, made on first use (two processes agree: the first link wins)."""
    key_file = CACHET_DATA / "secret_key"
    if not key_file.exists():
        CACHET_DATA.mkdir(parents=True, exist_ok=True)
        draft = CACHET_DATA / f".secret_key.{os.getpid()}"
        draft.write_text(secrets.token_urlsafe(50))
        draft.chmod(0o600)
        with contextlib.suppress(FileExistsError):
            os.link(draft, key_file)
        draft.unlink()
    return key_file.read_text().strip()


# Read (or generated) when first used, so importing the settings writes nothing.
SECRET_KEY: str = os.environ.get("SECRET_KEY") or lazy(_generated_secret_key, str)()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_htmx",
    "cachet",
    "axes",
    "procrastinate.contrib.django",
    "sessions_app",
    "chat",
]

MIDDLEWARE = [
    "chat.web.logins.RefusalDelayMiddleware",
    "cachet.security.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "cachet.login_mark.LoginMarkMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "chat.web.logins.FailedLoginLimitMiddleware",
    "axes.middleware.AxesMiddleware",
    "cachet.outage.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "cachet.urls"
ASGI_APPLICATION = "cachet.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "chat.web.context.theme",
                "chat.web.sidebar.sidebar",
            ],
            "libraries": {"chat_tags": "chat.web.templatetags"},
        },
    },
]


# One connection per request, closed after it. Under Daphne each request runs in a thread of its own, so a
# connection kept open (CONN_MAX_AGE > 0) is never reused: measured, 60 left 7-13 idle connections open after
# 105 page loads, for no faster page. Health checks stay on should that change.
CONN_MAX_AGE = 0


def _database() -> dict[str, Any]:
    """``DATABASE_URL``'s Postgres, else the embedded one, which the first connection starts."""
    url = os.environ.get("DATABASE_URL")
    if url:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=CONN_MAX_AGE, conn_health_checks=True))
        config["ENGINE"] = "django.db.backends.postgresql"
        return config
    return {
        "ENGINE": "cachet.embedded_backend",
        "NAME": embedded_pg.DATABASE_NAME,
        "USER": embedded_pg.USER,
        "CACHET_DATA": CACHET_DATA,
        "CONN_MAX_AGE": CONN_MAX_AGE,
        "CONN_HEALTH_CHECKS": True,
    }


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
# The pub/sub layer has no blocking command (its subscription is polled with a timeout of its own): an answer
# that takes longer than this means Redis is away, and the send fails rather than holding its relay.
REDIS_SOCKET_TIMEOUT = 5.0
# The channel layer always crosses processes (replies run in workers): Postgres LISTEN/NOTIFY on the database
# (``cachet.pg_layer``), or Redis where REDIS_URL is set.
CACHET_CHANNEL_LAYER = os.environ.get("CACHET_CHANNEL_LAYER") or ("redis" if REDIS_URL else "postgres")
if CACHET_CHANNEL_LAYER not in {"postgres", "redis"}:
    raise ValueError(f"CACHET_CHANNEL_LAYER is postgres or redis, not {CACHET_CHANNEL_LAYER!r}")
if CACHET_CHANNEL_LAYER == "redis" and not REDIS_URL:
    raise ValueError("CACHET_CHANNEL_LAYER=redis needs REDIS_URL")
CHANNEL_LAYERS: dict[str, Any]
if CACHET_CHANNEL_LAYER == "redis":
    from cachet.redis_layer import channel_prefix

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "cachet.redis_layer.RedisPubSubLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": REDIS_SOCKET_TIMEOUT}],
                "prefix": channel_prefix(REDIS_URL),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "cachet.pg_layer.PostgresChannelLayer", "CONFIG": {"capacity": 5000}}}

# The login failure counters and rendered markdown: shared through Redis where several processes serve; while
# Redis is away, in each process's memory (``cachet.cache``).
if REDIS_URL:
    CACHES: dict[str, Any] = {"default": {"BACKEND": "cachet.cache.ResilientRedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "OPTIONS": {"MAX_ENTRIES": 20_000},
        }
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

AUTHENTICATION_BACKENDS = ["chat.web.logins.LockoutBackend", "django.contrib.auth.backends.ModelBackend"]

# Sign-in with the company's directory (docs/deployment.md, "Sign-in with the company's directory"); each is off
# until its first setting is set, and local accounts keep working beside them. A directory group maps to a Cachet
# group by CACHET_*_GROUP_MAP ("DIRECTORY=CACHET" pairs, ";" between them); members of CACHET_*_STAFF_GROUPS are
# staff. Both are applied at every sign-in.
CACHET_OIDC_CLIENT_ID = os.environ.get("CACHET_OIDC_CLIENT_ID", "")
CACHET_OIDC_ISSUER = os.environ.get("CACHET_OIDC_ISSUER", "").rstrip("/")  # its /.well-known/openid-configuration
CACHET_OIDC_LABEL = os.environ.get("CACHET_OIDC_LABEL", "your company account")
CACHET_OIDC_GROUPS_CLAIM = os.environ.get("CACHET_OIDC_GROUPS_CLAIM", "groups")
CACHET_OIDC_GROUP_MAP = os.environ.get("CACHET_OIDC_GROUP_MAP", "")
CACHET_OIDC_STAFF_GROUPS = os.environ.get("CACHET_OIDC_STAFF_GROUPS", "")
if CACHET_OIDC_CLIENT_ID:
    from cachet.directory.oidc_settings import oidc_settings

    AUTHENTICATION_BACKENDS.append("cachet.directory.oidc.OidcBackend")
    globals().update(oidc_settings(os.environ))

CACHET_LDAP_URI = os.environ.get("CACHET_LDAP_URI", "")
CACHET_LDAP_GROUP_MAP = os.environ.get("CACHET_LDAP_GROUP_MAP", "")
CACHET_LDAP_STAFF_GROUPS = os.environ.get("CACHET_LDAP_STAFF_GROUPS", "")
if CACHET_LDAP_URI:
    try:
        from cachet.directory.ldap_settings import ldap_settings
    except ImportError as missing:
        raise ImportError(
            f"CACHET_LDAP_URI is set but django-auth-ldap is not installed ({missing}): install Cachet with its "
            "LDAP extra, .venv/bin/pip install '.[ldap]' (Debian needs libldap-dev libsasl2-dev to build it)"
        ) from missing

    AUTHENTICATION_BACKENDS.append("cachet.directory.ldap.LdapBackend")
    globals().update(ldap_settings(os.environ))

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "session_new"  # a message box, as chat apps open; the list is in the sidebar and at /
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = CACHET_DATA / "static"  # made by collectstatic (``serve`` runs it)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# WhiteNoise serves files through a synchronous iterator; under ASGI Django wraps it and warns per file.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")
# Before the first collectstatic, STATIC_ROOT does not exist; WhiteNoise serves from the finders meanwhile.
warnings.filterwarnings("ignore", message="No directory at: ")

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
USE_X_FORWARDED_HOST = env_bool("USE_X_FORWARDED_HOST", False)

# CACHET_TLS: people reach Cachet over https, through a proxy that terminates TLS and sets X-Forwarded-Proto.
ONE_YEAR = 365 * 24 * 60 * 60
CACHET_TLS = env_bool("CACHET_TLS", False)
SESSION_COOKIE_SECURE = CACHET_TLS
CSRF_COOKIE_SECURE = CACHET_TLS
# Cookie names of this instance's own (``cachet.cookies``): from SECRET_KEY, or where Cachet generates its key, from
# the data folder that holds it (reading a generated key here would make one whenever the settings are imported).
_cookies = cookie_names(os.environ.get("SECRET_KEY") or f"generated in {CACHET_DATA}", tls=CACHET_TLS)
SESSION_COOKIE_NAME = _cookies.session
CSRF_COOKIE_NAME = _cookies.csrf
CACHET_LOGIN_COOKIE_NAME = _cookies.login
SECURE_SSL_REDIRECT = CACHET_TLS
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS") or (ONE_YEAR if CACHET_TLS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0 and env_bool("SECURE_HSTS_PRELOAD", False)
if CACHET_TLS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if SECURE_HSTS_SECONDS and not SECURE_HSTS_PRELOAD:
    # Preloading is a promise to browsers' built-in lists that is slow to take back; only on request.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Logins (README "### Logins"): axes locks a (username, address) pair after CACHET_LOGIN_FAILURES failures for
# CACHET_LOGIN_LOCKOUT_MINUTES; an address with CACHET_LOGIN_IP_FAILURES_PER_MINUTE failures in a minute is
# refused for the rest of that minute. 0 turns either off. A refused login is answered after
# CACHET_LOGIN_REFUSAL_DELAY seconds. CACHET_PROXY_COUNT: trusted reverse proxies in front.
CACHET_LOGIN_FAILURES = int(os.environ.get("CACHET_LOGIN_FAILURES", "10"))
CACHET_LOGIN_LOCKOUT_MINUTES = int(os.environ.get("CACHET_LOGIN_LOCKOUT_MINUTES", "15"))
CACHET_LOGIN_IP_FAILURES_PER_MINUTE = int(os.environ.get("CACHET_LOGIN_IP_FAILURES_PER_MINUTE", "20"))
CACHET_LOGIN_REFUSAL_DELAY = float(os.environ.get("CACHET_LOGIN_REFUSAL_DELAY", "1"))
CACHET_PROXY_COUNT = int(os.environ.get("CACHET_PROXY_COUNT", "0"))
# /metrics (Prometheus): off unless CACHET_METRICS_TOKEN is set; then answered to that bearer token, or without one
# to the client addresses or networks in CACHET_METRICS_ALLOW (comma-separated, e.g. "10.0.0.5,192.168.1.0/24").
CACHET_METRICS_TOKEN = os.environ.get("CACHET_METRICS_TOKEN", "")
CACHET_METRICS_ALLOW = [part.strip() for part in os.environ.get("CACHET_METRICS_ALLOW", "").split(",") if part.strip()]
AXES_LOCK_OUT_AT_FAILURE = CACHET_LOGIN_FAILURES > 0
AXES_FAILURE_LIMIT = max(1, CACHET_LOGIN_FAILURES)
AXES_COOLOFF_TIME = timedelta(minutes=CACHET_LOGIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_LOCKOUT_CALLABLE = "chat.web.logins.lockout_response"
AXES_CLIENT_IP_CALLABLE = "chat.web.logins.client_address"
AXES_VERBOSE = False

# The endpoint named ``default``: where CACHET_MODEL_URL (or CACHET_MODEL) is set, each start sets its URL (its
# model) from it; where not, the first start makes it at CACHET_DEFAULT_MODEL_URL and later ones keep what staff set.
CACHET_MODEL_URL = os.environ.get("CACHET_MODEL_URL", "")
CACHET_MODEL = os.environ.get("CACHET_MODEL", "")
CACHET_DEFAULT_MODEL_URL = os.environ.get("CACHET_DEFAULT_MODEL_URL") or "http://127.0.0.1:8080/v1"
CACHET_WORKSPACES = os.environ.get("CACHET_WORKSPACES", "")
# Where workspace folders set in the admin or seeded from CACHET_WORKSPACES may lie (``sessions_app.folders``).
CACHET_WORKSPACE_ROOTS = [
    Path(item.strip()).expanduser()
    for item in (os.environ.get("CACHET_WORKSPACE_ROOTS") or str(CACHET_DATA / "workspaces")).split(",")
    if item.strip()
]
# The private workspaces, one folder a person (``people/ID``): in the data folder, so no other workspace can be there.
CACHET_PEOPLE = CACHET_DATA / "people"
CACHET_PROMPTS = Path(os.environ.get("CACHET_PROMPTS") or BASE_DIR / "prompts")
CACHET_TODAY = os.environ.get("CACHET_TODAY", "")
CACHET_CONNECT_TIMEOUT = float(os.environ.get("CACHET_CONNECT_TIMEOUT", "10"))
CACHET_FIRST_TOKEN_TIMEOUT = float(os.environ.get("CACHET_FIRST_TOKEN_TIMEOUT", "600"))
CACHET_CHUNK_TIMEOUT = float(os.environ.get("CACHET_CHUNK_TIMEOUT", "120"))
# Replies (and undo, rewind, compaction) one worker process (``manage.py worker``) runs at once, each holding a
# database connection; more wait in the queue. Keep it, times the workers, well under Postgres's max_connections
# (100 by default, the embedded one's too), which pages and sockets share. CACHET_MAX_REPLIES is its older name.
CACHET_WORKER_CONCURRENCY = max(
    1, int(os.environ.get("CACHET_WORKER_CONCURRENCY") or os.environ.get("CACHET_MAX_REPLIES") or "16")
)
CACHET_MAX_STEPS = int(os.environ.get("CACHET_MAX_STEPS", "0")) or None
CACHET_MAX_MESSAGE_BYTES = int(os.environ.get("CACHET_MAX_MESSAGE_BYTES", "200000"))
# The largest websocket frame (and message) Daphne reads under ``manage.py serve``; one over the message limit but
# within this is answered with a notice and its words put back in the box, a larger one closes the socket (1009).
CACHET_MAX_FRAME_BYTES = max(CACHET_MAX_MESSAGE_BYTES, int(os.environ.get("CACHET_MAX_FRAME_BYTES") or 4 * 1024 * 1024))
# Request bodies past these are refused before they are read (``cachet.body_limits``): every form, and the import's
# file, whose request may carry a form's worth more. Django's own limit on what it reads into memory agrees.
CACHET_MAX_BODY_BYTES = int(os.environ.get("CACHET_MAX_BODY_BYTES") or 1024 * 1024)
CACHET_IMPORT_MAX_BYTES = int(os.environ.get("CACHET_IMPORT_MAX_BYTES") or 64 * 1024 * 1024)
# Files attached to a session (the Attach button, a drop, a paste; New chat's too): at most this much in one request.
CACHET_UPLOAD_MAX_BYTES = int(os.environ.get("CACHET_UPLOAD_MAX_BYTES") or 20 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = CACHET_MAX_BODY_BYTES
CACHET_CHECK_REQUESTS = env_bool("CACHET_CHECK_REQUESTS", False)
# After a session's first reply the model is asked for its title, as the next turn of the conversation would ask.
CACHET_TITLES = env_bool("CACHET_TITLES", True)
CACHET_BWRAP = os.environ.get("CACHET_BWRAP") or "/usr/bin/bwrap"
# Who commands (the run tool) run as where Cachet runs as root: a user name or uid[:gid], never root.
CACHET_SANDBOX_USER = os.environ.get("CACHET_SANDBOX_USER") or "cachet-sandbox"
# The disk quota of a new workspace, in megabytes (0: none); staff change each workspace's in the admin.
CACHET_WORKSPACE_QUOTA_MB = int(os.environ.get("CACHET_WORKSPACE_QUOTA_MB") or "10240")

# An outage of Postgres is said once by the worker when it begins and once when it ends (chat.worker.process), not by
# the queue's library at every poll and heartbeat (its tracebacks), nor by the connection pool at every try.
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"outage": {"()": "chat.worker.quiet.OutageNoise"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["outage"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "pgserver": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
        "procrastinate": {"level": "WARNING"},
        "psycopg.pool": {"level": "ERROR"},
    },
}
