"""Leaseboard settings: one module, read from the environment, working with nothing set.

Defaults give a fresh checkout a SQLite file, the embedded hub and the in-process channel layer.
``dashboard.production`` tightens these for a real deployment.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from .clients import trusted_proxies
from .env import create_private, envbool, envfloat, envint, envlevels, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
# Where the SQLite database, the embedded hub, dead letters, landing and pipeline files go by default.
VAR_DIR = Path(envstr("LEASEBOARD_VAR_DIR", str(BASE_DIR / "var")))

# Django's secret key: the development default is refused by dashboard.production, which needs 50+ random characters.
SECRET_KEY = envstr("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me-in-production")
# Django's debug mode (and its query log); off under dashboard.production, and for the benches' workers.
DEBUG = envbool("DJANGO_DEBUG", True)
# Host names the console answers to, comma-separated.
ALLOWED_HOSTS = [h for h in envstr("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]

INSTALLED_APPS = [
    "dashboard.devserver",  # runserver under Daphne, imported only when it runs (see its docstring)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "dashboard",
    "workers",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A query string Django will not parse is a 400 before anything reads it (methods.py).
    "dashboard.web.methods.QueryLimit",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who may read, for every page and API (access.py: the one place that decides).
    "dashboard.web.access.ReadRule",
    # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Innermost: a view that finds the database or the store down answers 503, not 500 (degrade.py).
    "dashboard.web.degrade.OutageMiddleware",
    # Last, as django-axes asks: answers a locked-out login with the lockout page (AXES_* below).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "dashboard.web.urls"
ASGI_APPLICATION = "dashboard.asgi.application"
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
            ],
        },
    },
]

# The console's database, which the SQL store shares: a URL as dj-database-url reads it (sqlite:///PATH,
# postgres://USER:PASSWORD@HOST/NAME).
DATABASES = {
    "default": dj_database_url.parse(
        envstr("DATABASE_URL", f"sqlite:///{VAR_DIR / 'leaseboard.sqlite3'}"),
        conn_max_age=0,
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    create_private(str(DATABASES["default"]["NAME"]))  # it holds the session keys: 0600, not 0644
    # WAL lets the dashboard read while runworkers processes write; the timeout rides out the
    # short write locks that several processes sharing one file take in turn.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database cut off by the network (packets dropped, nothing refused) must fail in seconds: a
    # request sent into the cut is given up after LEASEBOARD_DB_TCP_TIMEOUT seconds (libpq's
    # tcp_user_timeout) and an idle connection is probed (keepalives), so a worker reports the
    # store unavailable in time and, after the heal, talks on a new connection instead of waiting
    # for TCP's next retransmission (whose backoff doubles while the cut lasts, up to 2 minutes).
    # The same span bounds a transaction left idle by a stalled client (a worker paused between its
    # SELECT ... FOR UPDATE and its commit): the server ends that session and its row locks go, so
    # the other workers' claims do not wait on them for as long as the stall lasts.
    _tcp = envfloat("LEASEBOARD_DB_TCP_TIMEOUT", 10.0)
    if not 0 < _tcp < 3600:
        raise ImproperlyConfigured(f"LEASEBOARD_DB_TCP_TIMEOUT must be between 0 and 3600 seconds, got {_tcp}")
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "connect_timeout": max(1, round(_tcp)),
        "keepalives": 1,
        "keepalives_idle": max(1, round(_tcp / 2)),
        "keepalives_interval": max(1, round(_tcp / 4)),
        "keepalives_count": 2,
        "tcp_user_timeout": round(_tcp * 1000),
        "options": f"-c idle_in_transaction_session_timeout={round(_tcp * 1000)}",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# Login throttling (django-axes): after LEASEBOARD_LOGIN_FAILURES wrong passwords for one user name
# from one address, that pair is refused for LEASEBOARD_LOGIN_COOLOFF_MINUTES, on /login/ and on
# the admin's login alike; each refusal and lockout is counted (dashboard/control/refusals.py). A right
# password resets the count. Before that, at most LEASEBOARD_LOGIN_RATE logins a minute per client
# address are tried at all (each costs a password hash; logins.LoginThrottle).
AUTHENTICATION_BACKENDS = ["dashboard.control.logins.LoginThrottle", "django.contrib.auth.backends.ModelBackend"]
# Wrong passwords for one user name from one address before that pair is refused.
AXES_FAILURE_LIMIT = envint("LEASEBOARD_LOGIN_FAILURES", 5, minimum=1)
# Logins a minute tried at all from one client, whatever names they give.
LEASEBOARD_LOGIN_RATE = envint("LEASEBOARD_LOGIN_RATE", 20, minimum=1)
# Wrong passwords for one user name from all addresses together within the cool-off past which a new
# address waits a doubling delay between tries (an address it logged in from is never held up).
LEASEBOARD_LOGIN_USER_FAILURES = envint("LEASEBOARD_LOGIN_USER_FAILURES", 10, minimum=1)
# Minutes a locked-out user name and address stay refused, and over which wrong passwords are counted.
AXES_COOLOFF_TIME = timedelta(minutes=envfloat("LEASEBOARD_LOGIN_COOLOFF_MINUTES", 15.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "dashboard/locked.html"
AXES_VERBOSE = False  # our own log lines say it once (logins.py)
# The proxies in front of the console (addresses or networks, comma-separated): requests from them are
# from the address their X-Forwarded-For gives (dashboard/clients.py), for the throttle and counts.
LEASEBOARD_TRUSTED_PROXIES = trusted_proxies(envstr("LEASEBOARD_TRUSTED_PROXIES", ""))
AXES_CLIENT_IP_CALLABLE = "dashboard.clients.client_address"
# Content-Security-Policy (django-csp): scripts, styles, images and sockets from this console only;
# no inline script or style anywhere (the pages take their data from data- attributes).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# The page takes the CSRF token from a <meta> tag, so no script needs to read the cookie.
CSRF_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "dashboard.control.logins.csrf_failure"

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# Redis: the channel layer across processes (release notices, the console's live feed) and the redis store
# (--store redis). Empty: the in-process channel layer.
REDIS_URL = envstr("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's layer, an idle receiver waking every 12 s instead of 5 (dashboard.live.layers).
            "BACKEND": "dashboard.live.layers.RedisChannelLayer",
            # redis-py 8 times reads out after 5 s by default: exactly channels_redis's 5 s BZPOPMIN,
            # so every idle websocket consumer died with "Timeout reading". Reads get more room.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "prefix": "leaseboard"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # The log level of every process (DEBUG, INFO, WARNING, ...).
    "root": {"handlers": ["console"], "level": envstr("LEASEBOARD_LOG_LEVEL", "INFO")},
    # The Azure SDK logs every HTTP request at INFO (a blob store cycle is a dozen of them).
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "azure": {"level": "WARNING"},
        # Levels of single loggers, comma-separated logger=LEVEL pairs: workers.runtime.cycles=DEBUG
        # logs every cycle of a worker (its seconds, how late its loop woke it, its store requests).
        **envlevels("LEASEBOARD_LOG_LEVELS"),
    },
}

# --- Leaseboard -------------------------------------------------------------------------------
# Which hub and consumer group this process balances and shows (command-line options override).
LEASEBOARD_NAMESPACE = envstr("LEASEBOARD_NAMESPACE", "localhost")
LEASEBOARD_HUB = envstr("LEASEBOARD_HUB", "sensors")
LEASEBOARD_CONSUMER_GROUP = envstr("LEASEBOARD_CONSUMER_GROUP", "$Default")
# Partitions of the embedded hub when it is first created.
LEASEBOARD_PARTITIONS = envint("LEASEBOARD_PARTITIONS", 16, minimum=1)
# Where the embedded hub keeps its partition logs (shared by every process on this machine).
LEASEBOARD_HUB_DIR = Path(envstr("LEASEBOARD_HUB_DIR", str(VAR_DIR / "hub")))
# Stores and sources, by the names of --store and --source.
LEASEBOARD_STORE = envstr("LEASEBOARD_STORE", "sql")
LEASEBOARD_SOURCE = envstr("LEASEBOARD_SOURCE", "embedded")
# The strategy of runworkers without --strategy, and of the action previews when no live worker names
# its own; empty: the project's default.
LEASEBOARD_STRATEGY = envstr("LEASEBOARD_STRATEGY", "")
# runworkers --load-weighted: the default strategy shares partitions by measured events per second.
LEASEBOARD_LOAD_WEIGHTED = envbool("LEASEBOARD_LOAD_WEIGHTED", False)
# What each --store name builds, resolved by workers.wiring as Channels resolves CHANNEL_LAYERS:
# "BACKEND" is the dotted path of the class, "CONFIG" its keyword arguments (each adapter reads its
# connection from the environment when not given one). "PROCESS_WIDE": one object per process, never
# closed (the memory store: embedded workers and the dashboard of one process must see the same
# leases). The SQL store lives beside its tables in the dashboard; the workers reach it only through
# this setting, so imports run one way (balancer <- workers <- dashboard).
LEASEBOARD_STORES: dict[str, dict[str, object]] = {
    "sql": {"BACKEND": "dashboard.sql.store.SqlStore", "CONFIG": {}},
    "memory": {"BACKEND": "balancer.stores.memory.MemoryStore", "CONFIG": {}, "PROCESS_WIDE": True},
    "redis": {"BACKEND": "balancer.stores.redis.store.RedisStore", "CONFIG": {}},
    "blob": {"BACKEND": "balancer.stores.blob.store.BlobStore", "CONFIG": {}},
}
# Where workers hand balancer events besides the log and the metrics: the dotted path of a callable
# taking a BalancerEvent (async preferred: the in-memory channel layer must be used from the loop that
# serves the websockets); empty: nowhere.
LEASEBOARD_EVENT_PUBLISHER = envstr("LEASEBOARD_EVENT_PUBLISHER", "dashboard.live.broadcast.apublish")
# Seconds between load-balancing cycles, and without renewal after which a lease is free.
LEASEBOARD_INTERVAL = envfloat("LEASEBOARD_INTERVAL", 2.0)
LEASEBOARD_EXPIRY = envfloat("LEASEBOARD_EXPIRY", 10.0)
# A worker that releases a partition tells the worker waiting for it at once, over the store's own
# channel (PostgreSQL LISTEN/NOTIFY, Redis pub/sub). False: receivers in other processes claim at
# their next quick cycle instead (for a PostgreSQL behind a transaction-pooling PgBouncer, which
# cannot LISTEN).
LEASEBOARD_RELEASE_NOTICES = envbool("LEASEBOARD_RELEASE_NOTICES", True)
# Checkpoint after this many events or seconds, whichever comes first.
LEASEBOARD_CHECKPOINT_EVENTS = envint("LEASEBOARD_CHECKPOINT_EVENTS", 100, minimum=1)
LEASEBOARD_CHECKPOINT_SECONDS = envfloat("LEASEBOARD_CHECKPOINT_SECONDS", 1.0)
# A handler call running longer than this many seconds is stuck: its thread is abandoned and the
# partition restarted from its checkpoint (0: never; like Kafka's max.poll.interval.ms, per partition).
# After LEASEBOARD_HANDLER_ABANDON_MAX abandoned threads the worker stops, for its supervisor to restart.
LEASEBOARD_HANDLER_TIMEOUT = envfloat("LEASEBOARD_HANDLER_TIMEOUT", 300.0)
LEASEBOARD_HANDLER_ABANDON_MAX = envint("LEASEBOARD_HANDLER_ABANDON_MAX", 3, minimum=1)
# A partition whose reader has kept failing this many seconds (restarted at every cycle meanwhile) is
# released, with its reason, for another worker to take; this one takes it no more for 5 minutes (0: never).
LEASEBOARD_READER_STUCK = envfloat("LEASEBOARD_READER_STUCK", 30.0)
# A reader that has handed nothing over for this many seconds while the hub holds events behind it (a
# link the hub stopped answering without closing it) is restarted as a failing reader (0: never).
LEASEBOARD_READER_WEDGED = envfloat("LEASEBOARD_READER_WEDGED", 15.0)
# Events a handler could not process after its retries, one JSON line each, per hub and partition.
LEASEBOARD_DEADLETTER_DIR = Path(envstr("LEASEBOARD_DEADLETTER_DIR", str(VAR_DIR / "deadletter")))
# The Spark pipeline: where workers land events as Parquet, how long a landing batch waits to fill
# (also how long an event may wait in the hub before its alert), whether the landing raises alerts
# itself as soon as their file is durable (else the pipeline's batch alone does, seconds later),
# where the pipeline keeps its checkpoint and results, and which Spark master runs it.
LEASEBOARD_LANDING_DIR = Path(envstr("LEASEBOARD_LANDING_DIR", str(VAR_DIR / "landing")))
LEASEBOARD_LANDING_LINGER = envfloat("LEASEBOARD_LANDING_LINGER", 0.2)
LEASEBOARD_LANDING_ALERTS = envbool("LEASEBOARD_LANDING_ALERTS", True)
LEASEBOARD_PIPELINE_DIR = Path(envstr("LEASEBOARD_PIPELINE_DIR", str(VAR_DIR / "pipeline")))
LEASEBOARD_SPARK_MASTER = envstr("LEASEBOARD_SPARK_MASTER", "local[*]")
# Optional external services: the Blob store's storage account and container (--store blob), and the event hub
# of --source eventhubs (a connection string with Listen rights).
AZURE_STORAGE_CONNECTION_STRING = envstr("AZURE_STORAGE_CONNECTION_STRING", "")
LEASEBOARD_BLOB_CONTAINER = envstr("LEASEBOARD_BLOB_CONTAINER", "leaseboard")
EVENTHUB_CONNECTION_STRING = envstr("EVENTHUB_CONNECTION_STRING", "")
# Events per read of --source eventhubs (the link credit; docs/azure.md: latency by prefetch).
EVENTHUB_PREFETCH = envint("EVENTHUB_PREFETCH", 20, minimum=1)
# Seconds a Blob request may wait for an answer (and to connect) before it is tried once more: keep it
# well under the lease expiry, as LEASEBOARD_DB_TCP_TIMEOUT for PostgreSQL (a request sent into a
# network cut otherwise outlasts the lease it renews).
LEASEBOARD_BLOB_TIMEOUT = envfloat("LEASEBOARD_BLOB_TIMEOUT", 10.0)
if not 0 < LEASEBOARD_BLOB_TIMEOUT < 3600:
    raise ImproperlyConfigured(
        f"LEASEBOARD_BLOB_TIMEOUT must be between 0 and 3600 seconds, got {LEASEBOARD_BLOB_TIMEOUT}"
    )

# --- the operator console ---------------------------------------------------------------------
# Anonymous visitors see the read-only console (True) or are sent to the login page (False).
# Actions always need a staff login, whatever this says; /metrics stays open for Prometheus.
LEASEBOARD_ANONYMOUS_READ = envbool("LEASEBOARD_ANONYMOUS_READ", True)
# Who sees event bodies in the partition page's event browser (/api/partitions/<id>/events): "staff" (as
# dead letters' bodies: a reader, anonymous by default, may not see what homes send) or "readers" (all
# who may read the console). Properties, keys, sequence numbers, offsets and times: every reader.
LEASEBOARD_EVENT_BODIES = envstr("LEASEBOARD_EVENT_BODIES", "staff")
if LEASEBOARD_EVENT_BODIES not in ("staff", "readers"):
    raise ImproperlyConfigured(f"LEASEBOARD_EVENT_BODIES must be staff or readers, got {LEASEBOARD_EVENT_BODIES!r}")
# The consumer group the event browser reads Event Hubs as ("": LEASEBOARD_CONSUMER_GROUP). Event Hubs
# refuses it a partition a worker's exclusive receiver reads in the same group: give it a group of its own.
LEASEBOARD_BROWSE_CONSUMER_GROUP = envstr("LEASEBOARD_BROWSE_CONSUMER_GROUP", "")
# Work a visitor can cause is bounded: at most this many hubs are watched at once (the least recently
# used unwatched one makes room; only hubs the store knows are watched at all), and at most this
# many websockets are served (more are closed with 4503, try again later).
LEASEBOARD_MONITORS_MAX = envint("LEASEBOARD_MONITORS_MAX", 16, minimum=1)
LEASEBOARD_SOCKETS_MAX = envint("LEASEBOARD_SOCKETS_MAX", 500, minimum=1)
# Of those, at most this many per client (a signed-in user, else an address); anonymous readers together
# leave a tenth to signed-in users (dashboard/web/sockets.py).
LEASEBOARD_SOCKETS_PER_CLIENT = envint("LEASEBOARD_SOCKETS_PER_CLIENT", 20, minimum=1)
# Lag status (docs/monitoring.md, "Lag and partition status"): a sample of every partition's checkpoint and lag
# every LAG_SAMPLE_SECONDS; the status is judged over the last LAG_WINDOW samples; STOP after no
# checkpoint for LAG_STOP_SECONDS; samples are kept LAG_RETENTION_SECONDS for the lag charts.
LEASEBOARD_LAG_SAMPLE_SECONDS = envfloat("LEASEBOARD_LAG_SAMPLE_SECONDS", 5.0)
LEASEBOARD_LAG_WINDOW = envint("LEASEBOARD_LAG_WINDOW", 10, minimum=2)
LEASEBOARD_LAG_STOP_SECONDS = envfloat("LEASEBOARD_LAG_STOP_SECONDS", 300.0)
LEASEBOARD_LAG_RETENTION_SECONDS = envfloat("LEASEBOARD_LAG_RETENTION_SECONDS", 3600.0)
# Desired workers (/metrics leaseboard_desired_workers, the fleet page): enough workers to keep up with
# the enqueue rate and drain the current backlog within this many seconds.
LEASEBOARD_TARGET_CATCHUP_SECONDS = envfloat("LEASEBOARD_TARGET_CATCHUP_SECONDS", 300.0)
if not 0 < LEASEBOARD_TARGET_CATCHUP_SECONDS < float("inf"):
    raise ImproperlyConfigured(
        "LEASEBOARD_TARGET_CATCHUP_SECONDS must be a positive number of seconds, "
        f"got {LEASEBOARD_TARGET_CATCHUP_SECONDS}"
    )
