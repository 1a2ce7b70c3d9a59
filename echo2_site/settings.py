"""ECHO-2 site settings, read from the environment (12-factor) with safe local defaults.

DATABASE_URL  default: SQLite file under ECHO2_DATA_DIR (./var)
REDIS_URL     default: redis://127.0.0.1:6379/0 (channel layer, Celery broker; trajectory streams unless
              ECHO2_STREAMS_REDIS_URL names another Redis: docs/trust.md "The learner's door")
SECRET_KEY    default: an insecure development key (DEBUG only)
SECRET_KEY_FALLBACKS default: none; comma-separated former SECRET_KEYs, still verified after a rotation
DEBUG         default: true
ALLOWED_HOSTS default: localhost,127.0.0.1,[::1],testserver

With DEBUG off the HTTPS settings (SECURE_*, *_COOKIE_SECURE) default to secure; the "Production" section of
docs/operations.md lists every variable, and `manage.py check --deploy` is clean with them.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None


def env_rate(name: str, default: str) -> str:
    """A rate in DRF's notation, ``N/s``, ``N/min``, ``N/hour`` or ``N/day``."""
    value = os.environ.get(name, "").strip() or default
    if not re.fullmatch(r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)", value):
        raise ImproperlyConfigured(f"{name} must look like 100/min (N per s, min, hour or day), got {value!r}")
    return value


def proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """``X-Forwarded-Proto: https`` (the header a trusted TLS proxy sets, and its value for HTTPS) as Django's
    ``("HTTP_X_FORWARDED_PROTO", "https")``; empty: no proxy header is trusted."""
    if not value.strip():
        return None
    header, sep, expected = value.partition(":")
    if not sep or not header.strip() or not expected.strip():
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https', got {value!r}")
    return "HTTP_" + header.strip().upper().replace("-", "_"), expected.strip()


BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("ECHO2_DATA_DIR", BASE_DIR / "var"))

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = os.environ.get("SECRET_KEY") or ("dev-insecure-key-change-me" if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS")  # rotated secrets, still verified (sessions, group seals)
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")]
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# HTTPS (docs/operations.md "Production"): secure by default when DEBUG is off. A plain-HTTP deployment on a
# trusted network (docker/compose.yaml) turns them off explicitly. Behind a TLS-terminating proxy, name the header
# it sets.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Path regexes served over plain HTTP too; the probes always are (a container's healthcheck speaks plain HTTP).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", *env_list("SECURE_REDIRECT_EXEMPT")]
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "marketplace",
    "frontend",
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Sign-in lockout (django-axes): last, so it sees the login view's outcome.
    "axes.middleware.AxesMiddleware",
]
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]

ROOT_URLCONF = "echo2_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = None
ASGI_APPLICATION = "echo2_site.asgi.application"

# Connections persist (CONN_MAX_AGE seconds, checked before reuse): a new connection per agent message was a large
# share of the site's time under load. 0 closes one at the end of each request, as Django's default.
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'echo2.sqlite3'}",
        conn_max_age=env_int("CONN_MAX_AGE", 60), conn_health_checks=True,
    )
}
DB_POOL_MAX = env_int("ECHO2_DB_POOL_MAX", 20)
if DATABASES["default"]["ENGINE"].endswith("postgresql") and DB_POOL_MAX > 0:
    # PostgreSQL: one pool of at most ECHO2_DB_POOL_MAX connections per site process (Django's psycopg pool), so a
    # burst of requests queues for a connection (up to ECHO2_DB_POOL_TIMEOUT_S) instead of each request thread
    # opening its own and keeping it for CONN_MAX_AGE: 150 concurrent requests took more connections than the
    # server allows and got 500s. A request hands its connection back when it ends (the pool needs
    # CONN_MAX_AGE 0); each is checked before it is handed out (CONN_HEALTH_CHECKS). Size it so that every
    # process's pool together (daphne x P, Celery x its concurrency, beat) stays under the server's max_connections.
    # 0: no pool (CONN_MAX_AGE as above; put pgbouncer in front instead).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(2, DB_POOL_MAX), "max_size": DB_POOL_MAX, "timeout": env_float("ECHO2_DB_POOL_TIMEOUT_S", 10.0),
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (daphne, Celery) share the file in the demo: take the write lock when a
    # transaction begins (no lock upgrades that fail at once), wait for it, and let readers run (WAL).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# The trajectory streams (each job's replay buffer) and the site's live state beside them; empty: REDIS_URL. Learners
# connect here, each as its job's own Redis user (docs/trust.md "The learner's door"), so a deployment that lets
# learners in from outside keeps the channel layer, the Celery broker and the cache on REDIS_URL, out of their reach.
STREAMS_REDIS_URL = os.environ.get("ECHO2_STREAMS_REDIS_URL", "")
# The streams' Redis as learners dial it, without credentials (each learner gets its own), e.g.
# rediss://streams.example.org:6380/0 for TLS; empty: the streams URL above without its user and password.
STREAMS_PUBLIC_URL = os.environ.get("ECHO2_STREAMS_PUBLIC_URL", "")
# A Redis user per learner session (Redis >= 6 ACLs) whose keys are its job's alone. Off (or a Redis without ACLs):
# every learner is handed the site's own streams URL, with full rights; the site says so when it starts.
LEARNER_REDIS_USERS = env_bool("ECHO2_LEARNER_REDIS_USERS", True)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "marketplace.realtime.channel_layer.ResilientRedisChannelLayer",
        # capacity: messages waiting per channel. Every socket of one site process shares that process's channel,
        # so channels_redis' default of 100 drops pushes silently when a fleet is assigned at once (1,000 agents on
        # one process). group_expiry: a socket's group memberships outlive any agent connection (default: a day).
        "CONFIG": {"hosts": [REDIS_URL], "prefix": os.environ.get("ECHO2_CHANNEL_PREFIX", "echo2"),
                   "capacity": env_int("ECHO2_CHANNEL_CAPACITY", 100_000), "group_expiry": 30 * 86400},
    }
}

# Throttle and lockout counters. Several site processes share them only in a shared cache: set ECHO2_CACHE_URL
# (a Redis URL) in production; the default local-memory cache counts per process.
CACHES = {
    "default": {"BACKEND": "echo2_site.cache.RedisCache", "LOCATION": os.environ["ECHO2_CACHE_URL"]}
    if os.environ.get("ECHO2_CACHE_URL") else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_TASK_TIME_LIMIT = 90
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A site process enqueuing a task while Redis restarts retries for about 3 s (0.1 s doubling to 1 s), then logs
# and goes on (services.base.enqueue_task): beat runs every enqueued task again. Workers reconnect by themselves.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 5, "interval_start": 0.1, "interval_step": 0.3,
                                    "interval_max": 1.0}
CELERY_BEAT_SCHEDULE = {
    "replan-running-jobs": {"task": "marketplace.tasks.replan_running_jobs", "schedule": 5.0},
    "expire-silent-workers": {"task": "marketplace.tasks.expire_silent_workers", "schedule": 10.0},
    # Heartbeats are kept in Redis (marketplace/infra/liveness.py): Worker.last_heartbeat lags by at most this period.
    "fold-worker-heartbeats": {"task": "marketplace.tasks.fold_worker_heartbeats",
                               "schedule": env_float("ECHO2_HEARTBEAT_FOLD_S", 2.0)},
    "stall-silent-learners": {"task": "marketplace.tasks.stall_silent_learners", "schedule": 10.0},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "frontend:home"  # the jobs, or a provider's own page (frontend.views.home)
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.api.auth.ApiTokenAuthentication",
        "marketplace.api.auth.AgentKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # An agent key opens only the endpoints the agent calls (marketplace.api.auth.NotAgentKey, docs/trust.md).
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "marketplace.api.auth.NotAgentKey"],
    "DEFAULT_SCHEMA_CLASS": "marketplace.api.schema.AutoSchema",  # documents the error responses too
    "EXCEPTION_HANDLER": "marketplace.api.errors.exception_handler",
    # JSON only (every client of ours sends JSON), with depth and NUL limits (marketplace.api.parsers).
    "DEFAULT_PARSER_CLASSES": ["marketplace.api.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_PAGINATION_CLASS": "marketplace.api.errors.Pagination",
    "PAGE_SIZE": 100,
    # Request rates (429 with Retry-After beyond them): per signed-in user, per anonymous address, and failed
    # credentials (wrong tokens, wrong agent keys, on HTTP and the agent websocket) per address. Generous: the
    # learner reports every step, the demo and the test suite never meet them.
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle",
                                 "rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "user": env_rate("ECHO2_THROTTLE_USER", "100/s"),
        "anon": env_rate("ECHO2_THROTTLE_ANON", "20/s"),
        "auth_failures": env_rate("ECHO2_THROTTLE_AUTH_FAILURES", "30/min"),
        "agent_hellos": env_rate("ECHO2_THROTTLE_AGENT_HELLOS", "30/min"),
    },
    # Proxies in front of the site that append to X-Forwarded-For: the client address throttles count by is the
    # one the outermost of them saw. 0 (the default): the socket's peer; never trust a header nobody overwrites.
    "NUM_PROXIES": env_int("ECHO2_NUM_PROXIES", 0),
}

# Sign-in lockout (django-axes): after ECHO2_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address,
# that pair is locked out for ECHO2_LOGIN_COOLOFF_S seconds (the page says so); a success resets the count.
AXES_FAILURE_LIMIT = env_int("ECHO2_LOGIN_FAILURE_LIMIT", 10)
AXES_COOLOFF_TIME = timedelta(seconds=env_float("ECHO2_LOGIN_COOLOFF_S", 900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "marketplace.api.throttling.client_address"  # the address the API throttles count by
# API tokens (``Authorization: Token e2u_...``): knox keeps only their sha512 and shows a token once, when it is
# made (provider page, ``manage.py drf_create_token``). They do not expire; replacing one revokes the old at once.
REST_KNOX = {"TOKEN_TTL": None, "TOKEN_PREFIX": "e2u_", "AUTH_HEADER_PREFIX": "Token", "AUTO_REFRESH": False}
SPECTACULAR_SETTINGS = {
    "TITLE": "ECHO-2 marketplace API",
    "DESCRIPTION": "Job control, worker registration and learner reporting for ECHO-2.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets come from the installed sidecar package, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "marketplace.models.Job.Status",
        "WorkerStatusEnum": "marketplace.models.Worker.Status",
        "JobStateEnum": "marketplace.models.Activation.State",
    },
}

# ECHO-2 control-plane knobs.
ECHO2 = {
    "HEARTBEAT_INTERVAL_S": float(os.environ.get("ECHO2_HEARTBEAT_INTERVAL_S", "2.0")),
    "WORKER_TIMEOUT_S": float(os.environ.get("ECHO2_WORKER_TIMEOUT_S", "30.0")),
    # A heartbeat goes to the database only when it changes something (marketplace/infra/liveness.py); a worker in a
    # billed state is reported at least this often (at most a third of WORKER_TIMEOUT_S), with its measured throughput.
    "HEARTBEAT_DB_SYNC_S": env_float("ECHO2_HEARTBEAT_DB_SYNC_S", 10.0),
    # A worker released for silence (socket closed, site outage) that says hello again within this many seconds
    # rejoins its job at once, rather than after the scheduler's hysteresis.
    "WORKER_REJOIN_S": env_float("ECHO2_WORKER_REJOIN_S", 300.0),
    "LEASE_TIMEOUT_S": float(os.environ.get("ECHO2_LEASE_TIMEOUT_S", "30.0")),
    # Hysteresis of the scheduler (paper C.2.1): act on a deviation from the target only after it lasted
    # this long; release only while capacity exceeds the target by this fraction.
    "REPLAN_INTERVAL_S": float(os.environ.get("ECHO2_REPLAN_INTERVAL_S", "60.0")),
    "RELEASE_MARGIN": float(os.environ.get("ECHO2_RELEASE_MARGIN", "0.25")),
    # A site request rides out a Redis outage this long (retrying with backoff) before it answers an error.
    "REDIS_RETRY_S": float(os.environ.get("ECHO2_REDIS_RETRY_S", "5.0")),
    # A running job whose learner is silent this long turns "stalled" and its workers are released.
    "LEARNER_TIMEOUT_S": float(os.environ.get("ECHO2_LEARNER_TIMEOUT_S", "90.0")),
    # An active worker whose agent reports its rollout loop failed (crashing and being restarted) for this long is
    # released, so the scheduler can activate another; failed time is never billed (docs/faults.md).
    "ROLLOUT_FAILED_RELEASE_S": env_float("ECHO2_ROLLOUT_FAILED_RELEASE_S", 120.0),
    # A worker that holds an activation and returns nothing is released (docs/trust.md "What the scheduler believes"):
    # installed, no group accepted for max(SILENT_RELEASE_S, SILENT_RELEASE_GROUPS x its expected group time n/mu_i);
    # no install of a published version reported LOADING_RELEASE_S after its assignment. Silent time is never billed.
    "SILENT_RELEASE_S": env_float("ECHO2_SILENT_RELEASE_S", 180.0),
    "SILENT_RELEASE_GROUPS": env_float("ECHO2_SILENT_RELEASE_GROUPS", 5.0),
    "LOADING_RELEASE_S": env_float("ECHO2_LOADING_RELEASE_S", 900.0),
    # A relay failure counts against the parent only when this many distinct children report it within the chain
    # score's decay window, or the parent itself is silent (RELAY_PARENT_SILENT_S without a heartbeat; or that long
    # after the publication without an install of the version reported); one child's word moves only that child.
    "RELAY_FAILURE_WITNESSES": env_int("ECHO2_RELAY_FAILURE_WITNESSES", 2),
    "RELAY_PARENT_SILENT_S": env_float("ECHO2_RELAY_PARENT_SILENT_S", 60.0),
    # Lifetime of a weight-transfer credential (docs/trust.md), re-issued with every snapshot message (publication,
    # repair, assignment). It must outlast a whole download at the slowest link: the learner's HTTP server checks
    # it on every chunk, a relay at each hello.
    "TRANSFER_CREDENTIAL_TTL_S": float(os.environ.get("ECHO2_TRANSFER_CREDENTIAL_TTL_S", "900")),
    # A job's model_dir is a checkpoint directory on the learner's machine. The site refuses a job whose
    # directory it cannot see when the job is created or started: true where site and learner share the
    # machine or a mount (the demo, the tests, docker compose); set false where the site cannot see the
    # learner's disk (then the learner refuses it at start).
    "CHECK_MODEL_DIR": env_bool("ECHO2_CHECK_MODEL_DIR", True),
    # Messages and bytes one agent connection may send (token buckets, announced in the welcome; dataplane/budget.py):
    # over them a frame gets a `rejected` reply naming its request with `retry_after`, and after this many refused in
    # a row the site closes the socket (4429). Honest agents pace themselves under them: batched, the fastest agent
    # we support sends a few messages per second (docs/trust.md "Limits").
    "AGENT_MESSAGES_PER_S": env_float("ECHO2_AGENT_MESSAGES_PER_S", 50.0),
    "AGENT_MESSAGE_BURST": env_float("ECHO2_AGENT_MESSAGE_BURST", 200.0),
    "AGENT_BYTES_PER_S": env_float("ECHO2_AGENT_BYTES_PER_S", float(64 << 20)),
    "AGENT_ABUSE_CLOSE_AFTER": env_int("ECHO2_AGENT_ABUSE_CLOSE_AFTER", 50),
    # A site process whose answers to leases and groups take longer than this on average, or whose event loop runs
    # its timers later than LOOP_LAG_S in half of a two-second period (short of CPU), announces a lower message budget
    # to its agents (a new `welcome`), halved every 2 s while it stays late, so they batch more and ask less before
    # leases expire (marketplace/realtime/lag.py).
    "REPLY_LAG_S": env_float("ECHO2_REPLY_LAG_S", 2.0),
    "LOOP_LAG_S": env_float("ECHO2_LOOP_LAG_S", 0.1),
    # How long an agent socket may check leases and groups against the running job it read
    # (marketplace/realtime/jobcache.py) without reading it again; every push that changes it (assign, release,
    # snapshot) drops it sooner. 0: read always.
    "AGENT_STATE_MAX_AGE_S": env_float("ECHO2_AGENT_STATE_MAX_AGE_S", 2.0),
    # Threads per site process for the agent sockets' database work (marketplace/realtime/dbthreads.py), each with a
    # connection from the process's pool while it works: keep it well under ECHO2_DB_POOL_MAX.
    "AGENT_DB_THREADS": env_int("ECHO2_AGENT_DB_THREADS", 4),
    # Largest agent websocket frame (bytes), announced to agents in the welcome. A legal group of 16 x 4096 tokens is
    # about 1.8 MiB of JSON; a bigger group comes as `trajectories_part` frames (docs/trust.md); a bigger frame is
    # refused and the socket closed with 4413. daphne's own limits must lie above it (DAPHNE_* below).
    "WS_MAX_MESSAGE_BYTES": env_int("ECHO2_WS_MAX_MESSAGE_BYTES", 8 << 20),
    # Deepest nesting of JSON objects and arrays accepted on the API and the agent websocket (ours need < 10).
    "JSON_MAX_DEPTH": env_int("ECHO2_JSON_MAX_DEPTH", 32),
    # Relay addresses and snapshot URLs that agents will dial (marketplace/core/addresses.py): link-local and cloud
    # metadata addresses are always refused; loopback only where allowed (development, tests, the demo), private
    # ranges only where the whole marketplace runs on one private network (docker/compose.yaml).
    "ALLOW_LOOPBACK_PEERS": env_bool("ECHO2_ALLOW_LOOPBACK_PEERS", DEBUG),
    "ALLOW_PRIVATE_PEERS": env_bool("ECHO2_ALLOW_PRIVATE_PEERS", False),
    # The only files the site reads for a task (a math task's JSONL): builtin:<file> or an absolute path under this
    # root, resolved (no symlink out), a regular file of at most TASK_DATA_MAX_BYTES (dataplane/tasks/files.py). The
    # learner and agents read their own machines' paths. Not ECHO2_DATA_DIR itself: it holds the database.
    "TASK_DATA_ROOT": Path(os.environ.get("ECHO2_TASK_DATA_ROOT") or DATA_DIR / "tasks"),
    "TASK_DATA_MAX_BYTES": env_int("ECHO2_TASK_DATA_MAX_BYTES", 64 << 20),
    # Data sets owners upload (POST /api/datasets/, docs/datasets.md): stored by digest in this folder, each at most
    # DATASET_MAX_BYTES. The site never reads a data set by a path a request names.
    "DATASET_DIR": Path(os.environ.get("ECHO2_DATASET_DIR") or DATA_DIR / "datasets"),
    "DATASET_MAX_BYTES": env_int("ECHO2_DATASET_MAX_BYTES", 256 << 20),
    # Bytes of uploaded data sets one owner may hold (a 409 past it).
    "DATASET_QUOTA_BYTES": env_int("ECHO2_DATASET_QUOTA_BYTES", 1 << 30),
    # Sign-in posts, refused with a 429 before Django (echo2_site/gate.py): per address and per process each
    # minute, and at most SIGNIN_INFLIGHT at once so a flood holds few of the pool's connections.
    "SIGNIN_PER_ADDRESS": env_int("ECHO2_SIGNIN_PER_ADDRESS", 10),
    "SIGNIN_PER_MIN": env_int("ECHO2_SIGNIN_PER_MIN", 600),
    "SIGNIN_INFLIGHT": env_int("ECHO2_SIGNIN_INFLIGHT", 4),
    # Requests without credentials in progress at once per process; past it a 503 with Retry-After.
    "ANON_INFLIGHT": env_int("ECHO2_ANON_INFLIGHT", 16),
    # A request body larger than this (by its Content-Length) is a 413 before it is read; data sets have their own.
    "MAX_BODY_BYTES": env_int("ECHO2_MAX_BODY_BYTES", 64 << 20),
    # Bounds on what strangers send (docs/trust.md "Bounds"): a snapshot's total bytes as its manifest declares them
    # (each chunk is at most 64 MiB, and no read takes more than a chunk's declared size), and the JSON of one
    # record's task metadata.
    "MAX_SNAPSHOT_BYTES": env_int("ECHO2_MAX_SNAPSHOT_BYTES", 1 << 40),
    "MAX_RECORD_METADATA_BYTES": env_int("ECHO2_MAX_RECORD_METADATA_BYTES", 1024),
    # A worker whose records failed this many of the learners' audits (all jobs) is suspended (docs/trust.md).
    "AUDIT_SUSPEND_AFTER": env_int("ECHO2_AUDIT_SUSPEND_AFTER", 3),
    # A log-prob or text failure the site cannot recompute counts (once per owner) only when learners of this many
    # distinct job owners report such failures of the worker; 0 (the default): never, since colluding owner
    # accounts could suspend an honest provider (docs/trust.md "Audits the site checks", "Failed work").
    "AUDIT_CORROBORATING_OWNERS": env_int("ECHO2_AUDIT_CORROBORATING_OWNERS", 0),
    # The site checks a reported text failure with the job's tokenizer, read from its version 0 on the learner and
    # cached here per base digest (marketplace/infra/job_tokenizer.py); the read (the whole base, hashed against its
    # digest) gives up after this many seconds and the failure stays "consistent", saying why.
    "AUDIT_TOKENIZER_DIR": Path(os.environ.get("ECHO2_AUDIT_TOKENIZER_DIR", DATA_DIR / "tokenizers")),
    "AUDIT_TOKENIZER_READ_S": env_float("ECHO2_AUDIT_TOKENIZER_READ_S", 300.0),
    # GET /metrics (Prometheus) with "Authorization: Bearer <this>"; unset, only a staff session may scrape.
    "METRICS_TOKEN": os.environ.get("ECHO2_METRICS_TOKEN", ""),
    # /readyz says Celery is down when no beat task ran for this long (beat runs replan_running_jobs every 5 s).
    "CELERY_STALE_S": env_float("ECHO2_CELERY_STALE_S", 30.0),
    # Where scripts/build-wheel.sh put the agent's wheel, served at /dist/ (frontend/dist.py). Not under
    # ECHO2_DATA_DIR: the wheel is built once per checkout (make install) or image, not per data directory.
    "DIST_DIR": Path(os.environ.get("ECHO2_DIST_DIR") or BASE_DIR / "var" / "dist"),
}
# daphne drops (without a close reason) any websocket message above its limit, 1 MiB by default: it must exceed
# the site's own limit, so that frames between the two get the site's reason and close code (4413).
# `manage.py runserver` reads these; the daphne command line takes --websocket-max-message-size and
# --websocket-max-frame-size (docker/compose.yaml, docs/operations.md "Production").
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE = DAPHNE_WEBSOCKET_MAX_FRAME_SIZE = 2 * ECHO2["WS_MAX_MESSAGE_BYTES"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}, "daphne": {"level": "WARNING"}},
}
