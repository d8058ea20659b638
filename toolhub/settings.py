"""toolhub settings: read from the environment only (see docs/deployment.md)."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from toolhub.env import (
    env_bool,
    env_int,
    env_json_list,
    env_json_object,
    env_list,
    env_secret,
    env_str,
    read_secret_file,
)

# Lets generic annotations such as admin.ModelAdmin[Tool] work at runtime.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("TOOLHUB_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("TOOLHUB_DEBUG", default=False)
# Unset keys fall back to the files scripts/run generates in the var directory, so that
# manage.py works in a checkout after `make run`; with neither, start-up still fails.
SECRET_KEY = env_secret(
    "TOOLHUB_SECRET_KEY",
    debug=DEBUG,
    dev_default="debug-only-secret-key-not-for-any-deployment-000000",
    fallback_file=VAR_DIR / "secret_key",
)
# Fernet keys for connection secrets, newest first (see apps/connections/crypto.py).
# Debug mode derives a throwaway key so a developer's shell needs no setup.
_ENCRYPTION_KEY_FILE = read_secret_file(VAR_DIR / "encryption_key")
TOOLHUB_ENCRYPTION_KEYS = (
    env_list("TOOLHUB_ENCRYPTION_KEY")
    or ([_ENCRYPTION_KEY_FILE] if _ENCRYPTION_KEY_FILE else [])
    or (
        [base64.urlsafe_b64encode(hashlib.sha256(SECRET_KEY.encode()).digest()).decode()]
        if DEBUG
        else []
    )
)
if not TOOLHUB_ENCRYPTION_KEYS:
    raise ImproperlyConfigured(
        "TOOLHUB_ENCRYPTION_KEY is required outside debug mode: one or more comma-separated "
        "Fernet keys (first encrypts, all decrypt)"
    )
ALLOWED_HOSTS = env_list("TOOLHUB_ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("TOOLHUB_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "guardian",
    "channels",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_tasks_db",
    "apps.tenants",
    "apps.tools",
    "apps.policies",
    "apps.connections",
    "apps.approvals",
    "apps.invocations",
    "apps.planning",
    "apps.mcp",
    "apps.retention",
    "oauth2_provider",
    "apps.oauth",
    "apps.receipts",
    "apps.audit",
    "apps.identity",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # One read of the authorization epoch per request, for every cache it asks.
    "apps.tenants.epoch.EpochMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it answers a locked-out login (see AXES_* below).
    "axes.middleware.AxesMiddleware",
    # A database outage is a 503 with Retry-After and one log line, not a 500 per request.
    "toolhub.web.outage.DatabaseOutageMiddleware",
]

ROOT_URLCONF = "toolhub.urls"
ASGI_APPLICATION = "toolhub.asgi.application"

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
                "apps.identity.context_processors.sign_in",
            ],
        },
    },
]


def _database(url: str) -> dict[str, object]:
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{VAR_DIR / 'toolhub.sqlite3'}"
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url, conn_max_age=0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["ENGINE"] = "toolhub.db.sqlite3"  # Django's, with one process's writers queued
        # A thread keeps its connection: a request's thread is kept for later requests
        # (toolhub/server/asgi_handler.py), and a new SQLite connection reads the schema again
        # before its first statement (about 2 ms of a 4 ms catalog request, issue 13).
        # A thread's connection closes when the thread ends; a broken one, as before,
        # at the end of its request.
        config["CONN_MAX_AGE"] = None
        # WAL lets readers run while one writer writes; IMMEDIATE transactions take
        # the write lock up front so concurrent writers wait (busy timeout) instead
        # of failing with "database is locked" on a lock upgrade.
        config["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        # Tests use a file, not :memory:, so that the runner's worker threads and
        # a test's Daphne subprocess see the same database.
        config["TEST"] = {"NAME": str(VAR_DIR / "test-toolhub.sqlite3")}
        if _pool_asked():
            raise ImproperlyConfigured(
                "TOOLHUB_DB_POOL* settings are for PostgreSQL; DATABASE_URL selects SQLite "
                "(unset them, or set TOOLHUB_DB_POOL=0)"
            )
        if env_bool("TOOLHUB_DB_PREPARED_STATEMENTS", default=False):
            raise ImproperlyConfigured(
                "TOOLHUB_DB_PREPARED_STATEMENTS is for PostgreSQL; DATABASE_URL selects SQLite "
                "(unset it, or set it to 0)"
            )
    elif config["ENGINE"] == "django.db.backends.postgresql":
        # Django's, failing fast while the database is down (toolhub/db/postgresql/base.py).
        config["ENGINE"] = "toolhub.db.postgresql"
        given = config.get("OPTIONS")  # e.g. sslmode from the URL's query
        options = dict(given) if isinstance(given, dict) else {}
        if env_bool("TOOLHUB_DB_PREPARED_STATEMENTS", default=True):
            # Django turns psycopg's prepared statements off (None) for transaction-mode
            # poolers; its own cursors never prepare anyway, only prepared_cursor() does.
            options.setdefault("prepare_threshold", 5)
        pool = _pool_options()
        if pool:
            options["pool"] = pool
        config["OPTIONS"] = options
    return config


_POOL_SIZES = ("TOOLHUB_DB_POOL_MIN_SIZE", "TOOLHUB_DB_POOL_MAX_SIZE", "TOOLHUB_DB_POOL_TIMEOUT")


def _pool_asked() -> bool:
    return env_bool("TOOLHUB_DB_POOL", default=False) or any(env_str(name) for name in _POOL_SIZES)


def _pool_options() -> dict[str, object] | None:
    """psycopg's pool for PostgreSQL, on unless TOOLHUB_DB_POOL=0.

    Without it every request connects anew (CONN_MAX_AGE=0, as Django advises under
    ASGI) and PostgreSQL forks a backend for it: a few ms per request. Sizing and
    fault handling: docs/deployment.md "Database connections".
    """
    if not env_bool("TOOLHUB_DB_POOL", default=True):
        return None
    min_size = env_int("TOOLHUB_DB_POOL_MIN_SIZE", 2, minimum=0, maximum=1000)
    max_size = env_int("TOOLHUB_DB_POOL_MAX_SIZE", 20, minimum=1, maximum=1000)
    if min_size > max_size:
        raise ImproperlyConfigured(
            f"TOOLHUB_DB_POOL_MIN_SIZE ({min_size}) is larger than "
            f"TOOLHUB_DB_POOL_MAX_SIZE ({max_size})"
        )
    from toolhub.db.postgresql.pool import POOL_OPTIONS

    return {
        **POOL_OPTIONS,
        "min_size": min_size,
        "max_size": max_size,
        # How long a request waits for a free connection before it answers 503.
        "timeout": env_int("TOOLHUB_DB_POOL_TIMEOUT", 5, minimum=1, maximum=300),
    }


DATABASES = {"default": _database(env_str("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "toolhub.layers.redis_layer.RedisLayer",
            "CONFIG": {
                # redis-py 8 times sockets out after 5 s, which races channels-redis's
                # 5 s blocking pop and kills idle streams: no client-side timeout.
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                # A subscriber that stops reading must not grow Redis without bound:
                # each channel holds at most `capacity` messages for `expiry` seconds.
                "capacity": env_int("TOOLHUB_CHANNEL_CAPACITY", 100, minimum=10),
                # Every feed of a process (apps/invocations/fanout.py) reads one channel: a
                # busy run's burst, or a process busy for a moment, must not overflow it.
                "channel_capacity": {
                    "feed.*": env_int("TOOLHUB_FEED_CAPACITY", 5000, minimum=10),
                },
                "expiry": env_int("TOOLHUB_CHANNEL_EXPIRY", 60, minimum=1),
                # Run streams re-join their group hourly, so a day is ample.
                "group_expiry": 86400,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": env_int("TOOLHUB_CHANNEL_CAPACITY", 100, minimum=10)},
        }
    }

# The result cache of read-only tools (apps/invocations/result_cache.py). Embedded: each
# process keeps its own, in memory. With REDIS_URL every process shares one in Redis, so
# a result computed by one process answers the next call wherever it lands.
TOOLHUB_RESULT_CACHE_ENTRIES = env_int(
    "TOOLHUB_RESULT_CACHE_ENTRIES", 10_000, minimum=100, maximum=10_000_000
)
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "results": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "toolhub-results",
            # A Redis that does not answer is a miss within a second, not a stuck call.
            "OPTIONS": {"socket_timeout": 1, "socket_connect_timeout": 1},
        }
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "toolhub-results",
            "OPTIONS": {"MAX_ENTRIES": TOOLHUB_RESULT_CACHE_ENTRIES},
        }
    ),
}

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username and address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    # ModelBackend, with staff permissions asked of the role in the object's tenant.
    "apps.tenants.backends.TenantRoleBackend",
    "guardian.backends.ObjectPermissionBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/admin/login/"

# Staff sign-in with an OpenID provider (apps/identity, docs/identity.md): on when an
# issuer is set. Endpoints come from the issuer's discovery document; groups -> roles by
# the mappings superusers keep in the admin. mozilla-django-oidc's settings follow.
TOOLHUB_OIDC_ISSUER = env_str("TOOLHUB_OIDC_ISSUER")
TOOLHUB_OIDC_GROUPS_CLAIM = env_str("TOOLHUB_OIDC_GROUPS_CLAIM", "groups")
TOOLHUB_OIDC_NAME = env_str("TOOLHUB_OIDC_NAME", "your identity provider")
TOOLHUB_PASSWORD_LOGIN = env_bool("TOOLHUB_PASSWORD_LOGIN", default=True)
OIDC_RP_CLIENT_ID = env_str("TOOLHUB_OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("TOOLHUB_OIDC_CLIENT_SECRET")
if TOOLHUB_OIDC_ISSUER:
    if not TOOLHUB_OIDC_ISSUER.startswith(("https://", "http://")):
        raise ImproperlyConfigured("TOOLHUB_OIDC_ISSUER must be an http(s) URL")
    if not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
        raise ImproperlyConfigured(
            "TOOLHUB_OIDC_ISSUER needs TOOLHUB_OIDC_CLIENT_ID and TOOLHUB_OIDC_CLIENT_SECRET"
        )
    if not TOOLHUB_OIDC_GROUPS_CLAIM:
        raise ImproperlyConfigured("TOOLHUB_OIDC_GROUPS_CLAIM must name a claim")
    AUTHENTICATION_BACKENDS.append("apps.identity.backends.OpenIDBackend")
    # After the messages middleware, before axes: ends sessions the provider ended.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.messages.middleware.MessageMiddleware") + 1,
        "apps.identity.middleware.ProviderSessionCheck",
    )
elif not TOOLHUB_PASSWORD_LOGIN:
    raise ImproperlyConfigured(
        "TOOLHUB_PASSWORD_LOGIN=0 needs TOOLHUB_OIDC_ISSUER: nobody could sign in"
    )
OIDC_RP_SIGN_ALGO = env_str("TOOLHUB_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env_str("TOOLHUB_OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_TOKEN_USE_BASIC_AUTH = True  # client_secret_basic, every provider's default
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
OIDC_TIMEOUT = 10
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int(
    "TOOLHUB_OIDC_RECHECK_SECONDS", 900, minimum=30, maximum=86400
)
OIDC_EXEMPT_URLS = [re.compile(r"^/(api|mcp|ws|static|healthz|readyz|metrics|\.well-known)(/|$)")]
LOGIN_REDIRECT_URL = "/admin/"
LOGIN_REDIRECT_URL_FAILURE = LOGIN_URL
# Login throttling (django-axes), for every password login (/admin/login/, which the console
# and the demo chat use): after TOOLHUB_LOGIN_FAILURE_LIMIT wrong passwords for one username
# from one client address, that pair is refused for TOOLHUB_LOGIN_COOLOFF_SECONDS, even with
# the right password. Other users, and the same user elsewhere, are unaffected. The address
# is REMOTE_ADDR: what Daphne sees, or with --proxy-headers the proxy's X-Forwarded-For.
AXES_FAILURE_LIMIT = env_int("TOOLHUB_LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=1000)
AXES_COOLOFF_TIME = timedelta(
    seconds=env_int("TOOLHUB_LOGIN_COOLOFF_SECONDS", 900, minimum=1, maximum=7 * 86400)
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "login_locked.html"
AXES_COOLOFF_MESSAGE = "Too many failed logins for this username from your address."
# Attempts are not tenant data and must not show in a tenant-scoped admin; locks are lifted
# with `manage.py axes_reset_username`. Successful logins are not stored (no unbounded table).
AXES_ENABLE_ADMIN = False
AXES_DISABLE_ACCESS_LOG = True
# No "AXES: BEGIN version ..." line at every start (each manage.py command, even --help);
# lockouts are still logged as warnings.
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Times with seconds, ISO order, everywhere (admin lists and pages included).
FORMAT_MODULE_PATH = ["toolhub.formats"]

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on a missing root
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.oauth.authentication.BearerAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["toolhub.web.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "toolhub.apidocs.openapi.ToolhubAutoSchema",
    "EXCEPTION_HANDLER": "toolhub.web.api.exception_handler",
    # ?format= selects the catalog's wire shape, not DRF's renderer.
    "URL_FORMAT_OVERRIDE": None,
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "toolhub API",
    "DESCRIPTION": "A governed tool-execution gateway for LLM agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # 3.1: its schema dialect is JSON Schema 2020-12, which pydantic models emit
    # (`anyOf [T, {"type": "null"}]` is invalid OpenAPI 3.0).
    "OAS_VERSION": "3.1.0",
    # toolhub/apidocs/openapi.py: the API description (auth, errors, status codes, lists, streams)
    # and curated component descriptions instead of docstrings.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "toolhub.apidocs.openapi.postprocess",
    ],
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
}

LOG_LEVEL = env_str("TOOLHUB_LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        f"TOOLHUB_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL; got {LOG_LEVEL!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # SafeFormatter escapes control characters in every field, so a logged value (a toolId
    # with a newline) cannot forge a line; tracebacks are indented (toolhub/ops/logs.py).
    "formatters": {
        "plain": {
            "()": "toolhub.ops.logs.SafeFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}

# Mail (core__send_email, approval notifications): console unless SMTP is configured.
_SMTP_HOST = env_str("TOOLHUB_SMTP_HOST")
MAILERS = {
    "default": (
        {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": _SMTP_HOST,
                "port": env_int("TOOLHUB_SMTP_PORT", 587, minimum=1, maximum=65535),
                "username": env_str("TOOLHUB_SMTP_USER"),
                "password": env_str("TOOLHUB_SMTP_PASSWORD"),
                "use_tls": env_bool("TOOLHUB_SMTP_STARTTLS", default=True),
                "timeout": 15,
            },
        }
        if _SMTP_HOST
        else {"BACKEND": "django.core.mail.backends.console.EmailBackend"}
    )
}
DEFAULT_FROM_EMAIL = env_str("TOOLHUB_FROM_EMAIL", "toolhub@localhost")

# The durable queue for approved calls and notifications (Django Tasks, database backend).
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
# Run a task worker inside the web process (the embedded demo); scale-out runs
# `manage.py toolhub_worker` processes instead.
TOOLHUB_EMBEDDED_WORKER = env_bool("TOOLHUB_EMBEDDED_WORKER", default=False)
# Where links in approval notifications point, e.g. https://toolhub.example.com
TOOLHUB_PUBLIC_URL = env_str("TOOLHUB_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")

# WebSocket streams: concurrent streams one principal may hold per process, and the
# close code a refused extra connection gets.
TOOLHUB_WS_MAX_PER_PRINCIPAL = env_int("TOOLHUB_WS_MAX_PER_PRINCIPAL", 20, minimum=1)
TOOLHUB_WS_CLOSE_TOO_MANY = 4429
# Bytes per second (and burst) a run stream hands the server; a stream that needs
# pacing for longer than TOOLHUB_WS_SLOW_CLIENT_SECONDS is closed with 4008. This
# bounds what a client that stops reading can pin in memory.
TOOLHUB_WS_SEND_RATE = env_int("TOOLHUB_WS_SEND_RATE", 256 * 1024, minimum=1024)
TOOLHUB_WS_SEND_BURST = env_int("TOOLHUB_WS_SEND_BURST", 1024 * 1024, minimum=64 * 1024)
TOOLHUB_WS_SLOW_CLIENT_SECONDS = env_int("TOOLHUB_WS_SLOW_CLIENT_SECONDS", 8, minimum=1)
# Live events one run stream holds while it catches up or paces a slow client;
# past that it drops them and re-reads them from the database when it can send.
TOOLHUB_WS_QUEUED_EVENTS = env_int("TOOLHUB_WS_QUEUED_EVENTS", 100, minimum=1)

# The largest request body accepted; a larger one gets 413 before it is read, whether it
# declares its length or streams it chunked (toolhub/server/limits.py). Django's own form-body
# limit follows it, so the two never disagree.
TOOLHUB_MAX_REQUEST_BYTES = env_int(
    "TOOLHUB_MAX_REQUEST_BYTES", 1024 * 1024, minimum=1024, maximum=1024 * 1024 * 1024
)
DATA_UPLOAD_MAX_MEMORY_SIZE = TOOLHUB_MAX_REQUEST_BYTES

# GET /metrics (toolhub/ops/metrics.py) answers `Authorization: Bearer <this>` and superuser
# sessions only. Unset: superusers only (no scraper). Set: 32+ characters.
TOOLHUB_METRICS_TOKEN = env_str("TOOLHUB_METRICS_TOKEN", "").strip()
if TOOLHUB_METRICS_TOKEN and len(TOOLHUB_METRICS_TOKEN) < 32:
    raise ImproperlyConfigured("TOOLHUB_METRICS_TOKEN must be at least 32 characters long")

# Where the runner finds tools (apps/tools/sources.py), asked in order.
TOOLHUB_TOOL_SOURCES = ["apps.tools.sources.BuiltinSource", "apps.mcp.source.McpSource"]
# Executables an MCP server registered over stdio may run (apps/mcp); staff-only, never
# chosen through the API. Empty: no stdio server can be added.
TOOLHUB_MCP_STDIO_COMMANDS = env_list("TOOLHUB_MCP_STDIO_COMMANDS")
# toolhub as an MCP server (/mcp/, apps/mcp/server): tools per tools/list page, and how
# long a session id stays valid (sessions are signed ids, stored nowhere).
TOOLHUB_MCP_PAGE_SIZE = env_int("TOOLHUB_MCP_PAGE_SIZE", 100, minimum=1, maximum=1000)
TOOLHUB_MCP_SESSION_TTL_S = env_int(
    "TOOLHUB_MCP_SESSION_TTL_S", 24 * 3600, minimum=60, maximum=30 * 24 * 3600
)
# OAuth access tokens as Bearer credentials (apps/oauth, docs/oauth.md). The resource is
# toolhub's canonical URL that tokens must name as their audience (RFC 8707); unset, it is
# <scheme>://<host>/mcp of the request. An external issuer's tokens (JWTs, checked against
# its OpenID discovery document and JWKS) name the tenant and principal in these claims.
TOOLHUB_OAUTH_RESOURCE = env_str("TOOLHUB_OAUTH_RESOURCE").rstrip("/")
TOOLHUB_OAUTH_EXTERNAL_ISSUER = env_str("TOOLHUB_OAUTH_EXTERNAL_ISSUER")
TOOLHUB_OAUTH_PRINCIPAL_CLAIM = env_str("TOOLHUB_OAUTH_PRINCIPAL_CLAIM", "sub")
TOOLHUB_OAUTH_TENANT_CLAIM = env_str("TOOLHUB_OAUTH_TENANT_CLAIM", "toolhub_tenant")
# The scope a token needs for /mcp/, the run streams and the REST API.
TOOLHUB_OAUTH_SCOPE = env_str("TOOLHUB_OAUTH_SCOPE", "mcp")
for _name, _url in (
    ("TOOLHUB_OAUTH_RESOURCE", TOOLHUB_OAUTH_RESOURCE),
    ("TOOLHUB_OAUTH_EXTERNAL_ISSUER", TOOLHUB_OAUTH_EXTERNAL_ISSUER),
):
    if _url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", _url):
        raise ImproperlyConfigured(f"{_name} must be an http(s) URL without query; got {_url!r}")
if not TOOLHUB_OAUTH_PRINCIPAL_CLAIM or not TOOLHUB_OAUTH_TENANT_CLAIM:
    raise ImproperlyConfigured("TOOLHUB_OAUTH_PRINCIPAL_CLAIM and _TENANT_CLAIM may not be empty")
if not re.fullmatch(r"[\x21\x23-\x5b\x5d-\x7e]+", TOOLHUB_OAUTH_SCOPE):
    raise ImproperlyConfigured(
        f"TOOLHUB_OAUTH_SCOPE must be one scope token; got {TOOLHUB_OAUTH_SCOPE!r}"
    )
# toolhub's own OAuth authorization server (apps/oauth/server.py, django-oauth-toolkit):
# MCP clients register (RFC 7591, client ID metadata documents), a tenant admin consents
# to a principal, the client gets tokens for /mcp/ and the run streams only. Off unless
# TOOLHUB_OAUTH_SERVER=1 (scripts/run turns it on for the demo).
TOOLHUB_OAUTH_SERVER = env_bool("TOOLHUB_OAUTH_SERVER", default=False)
TOOLHUB_OAUTH_TOKEN_TTL_S = env_int("TOOLHUB_OAUTH_TOKEN_TTL_S", 3600, minimum=60, maximum=86400)
# Named so that migrations referring to the toolkit's (swappable) models resolve.
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth2_provider.AccessToken"  # noqa: S105
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth2_provider.RefreshToken"  # noqa: S105
OAUTH2_PROVIDER_GRANT_MODEL = "oauth2_provider.Grant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth2_provider.IDToken"  # noqa: S105
OAUTH2_PROVIDER = {
    "SCOPES": {TOOLHUB_OAUTH_SCOPE: "Use the principal's tools on /mcp/ and the run streams"},
    "DEFAULT_SCOPES": [TOOLHUB_OAUTH_SCOPE],
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,  # S256 only: plain is refused
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,  # tokens kept as checksums only
    # RFC 9207: the authorization response names its issuer (`iss`, the origin, as in the
    # RFC 8414 metadata), so a client talking to several servers detects a mix-up.
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    # Tokens are read from the Authorization header only (apps/oauth/bearer.py).
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": TOOLHUB_OAUTH_TOKEN_TTL_S,
    "REFRESH_TOKEN_EXPIRE_SECONDS": 30 * 24 * 3600,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ACCESS_TOKEN_GENERATOR": "apps.oauth.server.access_token",
    "REFRESH_TOKEN_GENERATOR": "apps.oauth.server.refresh_token",
    "OAUTH2_VALIDATOR_CLASS": "apps.oauth.server.Validator",
    "DCR_ENABLED": True,  # these endpoints answer 404 while TOOLHUB_OAUTH_SERVER is off
    # Anyone may register a client: a client gets nothing until a tenant admin consents.
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "CIMD_ENABLED": True,
    "CIMD_METADATA_FETCHER": "apps.oauth.server.GuardedMetadataFetcher",
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": [
        "none",
        "client_secret_post",
        "client_secret_basic",
    ],
}
# RFC 9700 §2.1 warns about `http` redirect URIs; native MCP clients need them for their
# loopback callback (RFC 8252), so toolhub keeps `http` and allows it to loopback only
# (apps/oauth/server.py plaintext_redirect_problem, at registration and authorization).
SILENCED_SYSTEM_CHECKS = ["oauth2_provider.W008"]
# Extra modules whose CONTRACTS are registered next to the built-in tools.
TOOLHUB_TOOL_MODULES = [
    "apps.tools.builtin.clock",
    "apps.tools.builtin.planning",
    "apps.tools.builtin.http",
    "apps.tools.builtin.email",
    *env_list("TOOLHUB_EXTRA_TOOL_MODULES"),
]
# Logs show argument shapes (keys and types); set to log redacted values instead.
TOOLHUB_LOG_ARGUMENT_VALUES = env_bool("TOOLHUB_LOG_ARGUMENT_VALUES", default=False)
# Threads that run tool code; a tool that ignores its deadline keeps one busy. Started only
# when needed; 128 lets 50 concurrent 1 s calls finish in about 1 s (issue 13; 32 took 2 s+).
TOOLHUB_TOOL_THREADS = env_int("TOOLHUB_TOOL_THREADS", 128, minimum=1, maximum=1024)
# Hooks (docs/hooks.md): code that takes part in every tool call, as a JSON list of
# entries; the system check (manage.py check) refuses one that does not load.
TOOLHUB_HOOKS = env_json_list("TOOLHUB_HOOKS")
# The idempotency strategy of a tool whose contract names none, per effect, over the
# shipped ones (apps/tools/call_settings.py SHIPPED_DEFAULTS): a JSON object such as
# {"read_only": {"strategy": "none"}, "external_side_effect": {"scope": "principal",
# "ttl_s": 3600}}. A bad entry stops start-up, named.
TOOLHUB_IDEMPOTENCY_DEFAULTS = env_json_object("TOOLHUB_IDEMPOTENCY_DEFAULTS")
# How long one hook may run (ms), cut to the time the call has left.
TOOLHUB_HOOK_TIMEOUT_MS = env_int("TOOLHUB_HOOK_TIMEOUT_MS", 2000, minimum=10, maximum=600_000)
# Tool threads whose call already ended (timeout, cancelled) but whose code still runs
# (Python cannot stop a thread): past this many for one tool, or past the total while the
# tool has any, its new calls are refused `unavailable` instead of taking more threads.
TOOLHUB_TOOL_LINGERING_PER_TOOL = env_int(
    "TOOLHUB_TOOL_LINGERING_PER_TOOL", max(1, TOOLHUB_TOOL_THREADS // 8), minimum=1
)
TOOLHUB_TOOL_LINGERING_MAX = env_int(
    "TOOLHUB_TOOL_LINGERING_MAX", max(1, TOOLHUB_TOOL_THREADS // 2), minimum=1
)
# Concurrency limits (a tool's max_concurrency, a tenant's max_concurrent_calls): how long
# a call over the limit waits for a slot before it is refused `rate_limited` with a hint.
TOOLHUB_CONCURRENCY_WAIT_S = env_int("TOOLHUB_CONCURRENCY_WAIT_S", 10, minimum=0, maximum=300)
# Call leases (apps/invocations/leases.py, docs/deployment.md): a running call's process
# renews its lease every fifth of this; a call whose lease ran out (its process died) is
# settled by the next lease pass of a worker's sweeper, every TOOLHUB_LEASE_SWEEP_MS, or
# at once by a same-key retry.
TOOLHUB_CALL_LEASE_MS = env_int("TOOLHUB_CALL_LEASE_MS", 10_000, minimum=500, maximum=600_000)
TOOLHUB_LEASE_SWEEP_MS = env_int("TOOLHUB_LEASE_SWEEP_MS", 2_000, minimum=100, maximum=60_000)
# Retention (apps/retention, docs/deployment.md): days a finished call (record, run
# events, approval) is kept unless its tenant sets its own. Unset keeps everything; 0 or
# less is refused. The worker prunes every TOOLHUB_RETENTION_EVERY_S seconds.
TOOLHUB_RETENTION_DAYS = env_int("TOOLHUB_RETENTION_DAYS", 0, minimum=1) or None
TOOLHUB_RETENTION_EVERY_S = env_int("TOOLHUB_RETENTION_EVERY_S", 3600, minimum=60)

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    CSRF_COOKIE_SAMESITE = "Lax"
    X_FRAME_OPTIONS = "DENY"
    SECURE_CONTENT_TYPE_NOSNIFF = True

# HTTPS, for deployments behind TLS (docs/deployment.md, "Production environment"). Off by
# default because the embedded demo serves plain HTTP on 127.0.0.1. Daphne's
# --proxy-headers takes the scheme from the proxy's X-Forwarded-Proto.
SECURE_SSL_REDIRECT = env_bool("TOOLHUB_SECURE_SSL_REDIRECT", default=False)
# Load balancers probe over plain HTTP; a redirect would fail them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("TOOLHUB_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TOOLHUB_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env_bool("TOOLHUB_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("TOOLHUB_SECURE_COOKIES", default=False)
