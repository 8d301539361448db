"""The console's API against its OpenAPI document (``/api/schema``, ``dashboard/web/openapi.py``).

``test_no_input_reaches_a_500_or_leaves_the_schema`` runs schemathesis (its CLI, in a subprocess)
against a real Daphne console on SQLite whose store knows two hubs (``seed_fleet``), logged in as
staff with a CSRF token so that the actions are fuzzed past the CSRF check into their own code:
every operation, positive and negative inputs, every phase (examples, coverage, fuzzing, stateful)
and every default check (no 500; status codes, content types, headers and bodies as documented;
invalid input refused; valid input accepted, but for the actions: see ``schemathesis.toml``). The
run is bounded by the examples per operation and the fixed seed in ``schemathesis.toml``; its
output is kept in ``test-artifacts/schemathesis.txt``. The plain tests check that the document is
valid OpenAPI, that every ``/api/`` URL pattern is in it, and that it is read under the read rule.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import schemathesis
from django.conf import LazySettings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from schemathesis.core.result import Err, Ok

from dashboard.web.openapi import document
from tests.dashboard.api_document import conforms, conforms_response
from tests.dashboard.console_process import ROOT, Console, environment, migrate
from tests.support.postgres import start_postgres
from workers.hub.embedded import EmbeddedHub

HUBS = ("sensors", "orders")  # the configured hub, and one only the store knows
PASSWORD = "fuzz-the-console"
CONFIG = Path(__file__).with_name("schemathesis.toml")  # seed, examples per operation, checks, auth
ARTIFACTS = ROOT / "test-artifacts"  # schemathesis.txt: the whole output of the last run
# Examples per operation of the two runs on the production console (anonymous, staff), as the
# configured ones of the development run. The coverage and stateful phases do not shrink with it.
PRODUCTION_EXAMPLES = 25
# A run takes 50-100 s on a quiet 2-core machine and 280-300 s on a starved one (seen once, beside the
# whole suite): the run's own bound first (its output then says how far it got), then the test's.
RUN_TIMEOUT = 720
FUZZ_TIMEOUT = pytest.mark.timeout(RUN_TIMEOUT + 120)


def _run(*command: str, env: dict[str, str]) -> None:
    subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=180, capture_output=True)


@contextmanager
def _served(var: Path, env: dict[str, str], *before: tuple[str, ...]) -> Iterator[Console]:
    """A Daphne console on ``var`` whose store knows ``HUBS``: migrated, ``before`` run (manage.py
    commands), the fleet seeded; stopped on the way out."""
    for name in HUBS:
        with EmbeddedHub(var / "hub", name, partitions=4) as hub:
            hub.send_batch([b'{"sensor": "door"}'] * 5, partition_id="0")
    migrate(env)
    for command in before:
        _run(sys.executable, "manage.py", *command, env=env)
    _run(sys.executable, "-m", "tests.dashboard.seed_fleet", *HUBS, env=env)
    server = Console(var, env)
    server.start_daphne()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    var = tmp_path_factory.mktemp("fuzz")
    with _served(var, environment(var, LEASEBOARD_ADMIN_PASSWORD=PASSWORD), ("ensureadmin",)) as server:
        yield server


@pytest.fixture(scope="module")
def production_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """The console as deployed: ``dashboard.production`` settings (DEBUG off) on PostgreSQL, whose
    strings refuse what SQLite's take (NUL, more than a column's length), behind a TLS proxy on
    loopback (``BEHIND_PROXY``: the requests say they came over HTTPS, so the secure session and
    CSRF cookies, and the CSRF check's Referer rule for HTTPS, apply as in production)."""
    var = tmp_path_factory.mktemp("fuzz-production")
    database = start_postgres()
    try:
        env = environment(
            var,
            DJANGO_SETTINGS_MODULE="dashboard.production",
            DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
            DATABASE_URL=database.url,
            LEASEBOARD_SSL_REDIRECT="0",
            LEASEBOARD_BEHIND_TLS_PROXY="1",
            LEASEBOARD_TRUSTED_PROXIES="127.0.0.1",
            LEASEBOARD_ADMIN_PASSWORD=PASSWORD,
        )
        with _served(var, env, ("ensureadmin",)) as server:
            yield server
    finally:
        database.stop()


def behind_proxy(url: str) -> dict[str, str]:
    """The headers of a request the TLS proxy passes on (``production_console``): it came over HTTPS,
    from a page of the console (the Referer Django's CSRF check asks of an HTTPS request)."""
    return {"X-Forwarded-Proto": "https", "Referer": url.replace("http://", "https://", 1) + "/"}


def staff_login(url: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """The cookies of a staff session (``sessionid``, ``csrftoken``), logged in through ``/login/``
    (with ``headers`` on each request: ``behind_proxy``'s, where the cookies are HTTPS-only and so
    sent here by hand)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(urllib.request.Request(f"{url}/login/", headers=headers or {}), timeout=30):
        pass
    token = next(c.value for c in jar if c.name == "csrftoken")
    form = {"username": "admin", "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/"}
    sent = {**headers, "Cookie": f"csrftoken={token}"} if headers else {}
    login = urllib.request.Request(f"{url}/login/", urllib.parse.urlencode(form).encode(), sent)
    with opener.open(login, timeout=30):
        pass
    cookies = {c.name: c.value for c in jar if c.value is not None}  # (a cookie without a value: no session)
    assert "sessionid" in cookies, f"the staff login failed: {sorted(cookies)}"
    return cookies


def run_schemathesis(
    url: str,
    cookies: dict[str, str],
    headers: dict[str, str] | None = None,
    examples: int | None = None,
    phases: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """schemathesis's CLI against ``url``'s document, with ``CONFIG`` and the staff session ``cookies``
    (and ``headers`` on every request; ``examples`` per operation instead of the configured ones;
    ``phases`` only, comma-separated, instead of all four)."""
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{url}/api/schema",
        *(f"--header={name}: {value}" for name, value in (headers or {}).items()),
        *([f"--max-examples={examples}"] if examples else []),
        *([f"--phases={phases}"] if phases else []),
    ]
    env = {
        **os.environ,
        "LEASEBOARD_FUZZ_SESSION": cookies["sessionid"],
        "LEASEBOARD_FUZZ_CSRF": cookies["csrftoken"],
    }
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def assert_clean_run(run: subprocess.CompletedProcess[str], console: Console, artifact: str) -> None:
    """The run's summary printed and its whole output kept (``test-artifacts/<artifact>``); it passed,
    and tested every operation but GET /api/schema itself (schemathesis leaves it out when it reads the
    document there)."""
    summary = run.stdout[run.stdout.rfind("\n", 0, run.stdout.rfind(" SUMMARY ")) + 1 :]
    print(f"python {' '.join(run.args[1:])}\n{summary}")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / artifact).write_text(f"python {' '.join(run.args[1:])}\n{run.stdout}{run.stderr}")
    assert run.returncode == 0, f"{run.stdout[-20_000:]}\n{run.stderr[-4000:]}\nconsole:\n{console.output()[-4000:]}"
    operations = sum(len(methods) for methods in document()["paths"].values()) - 1
    assert f"Tested: {operations}\n" in run.stdout and "Skipped:" not in run.stdout, summary


@pytest.mark.slow
@FUZZ_TIMEOUT
def test_no_input_reaches_a_500_or_leaves_the_schema(console: Console) -> None:
    assert_clean_run(run_schemathesis(console.url, staff_login(console.url)), console, "schemathesis.txt")


@pytest.mark.slow
@FUZZ_TIMEOUT
def test_no_anonymous_input_reaches_a_500_on_postgresql_with_the_production_settings(
    production_console: Console,
) -> None:
    """The same run, as an anonymous reader (the actions refused before their code: 403, counted) of a
    console deployed as the manual says (docs/monitoring.md, "Deployment"). Without the coverage phase
    (two thirds of a run, about 65 s): its boundary values on the reads are the staff run's below, on
    the same code, and an anonymous action is refused before its body is read; the examples and the
    fuzzing phase still send every operation valid and invalid input as an anonymous reader."""
    url = production_console.url
    anonymous = {"sessionid": "", "csrftoken": ""}
    run = run_schemathesis(url, anonymous, behind_proxy(url), PRODUCTION_EXAMPLES, "examples,fuzzing")
    assert_clean_run(run, production_console, "schemathesis-production.txt")
    assert "Traceback" not in production_console.output(), production_console.output()[-4000:]


@pytest.mark.slow
@FUZZ_TIMEOUT
def test_no_staff_input_reaches_a_500_on_postgresql_with_the_production_settings(
    production_console: Console,
) -> None:
    """And as staff, past the login and the CSRF check into the actions' own code, over the proxy's HTTPS."""
    url, headers = production_console.url, behind_proxy(production_console.url)
    cookies = staff_login(url, headers)
    run = run_schemathesis(url, cookies, headers, PRODUCTION_EXAMPLES)
    assert_clean_run(run, production_console, "schemathesis-production-staff.txt")
    assert "Traceback" not in production_console.output(), production_console.output()[-4000:]
    # The actions were fuzzed past the login and the CSRF check: the audit log holds the staff's own.
    session = {**headers, "Cookie": f"sessionid={cookies['sessionid']}"}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/audit?limit=500", headers=session)) as answer:
        entries = json.load(answer)
    assert any(entry["user"] == "admin" for entry in entries), entries[:5]


@pytest.mark.slow
def test_what_django_will_not_parse_is_answered_as_documented(console: Console) -> None:
    """What schemathesis does not send: more query fields than Django parses (a 500 with DEBUG on, the
    console's default, before ``methods.read_only``), a body over its size limit, a form over its
    field limit (a JSON 413 and a 400); on the live console with DEBUG on."""
    many = "&".join(f"p{i}=1" for i in range(1_100))
    for path, methods in document()["paths"].items():
        if "get" in methods:
            url = f"{path.replace('{partition_id}', '0')}?{many}"
            answer = console.get(url)
            assert answer.status == 400 and answer.json()["error"].startswith("too many query parameters"), answer
            conforms("GET", url, answer.status, answer.content_type, answer.body)

    cookies = staff_login(console.url)
    staff = {
        "Cookie": f"sessionid={cookies['sessionid']}; csrftoken={cookies['csrftoken']}",
        "X-CSRFToken": cookies["csrftoken"],
    }
    too_big = json.dumps({"action": "drain", "target": "x" * 3_000_000, "reason": "r"}).encode()
    bodies = [("application/json", too_big, 413), ("application/x-www-form-urlencoded", many.encode(), 400)]
    for path in ("/api/actions/preview", "/api/actions/apply"):
        for content_type, body, status in bodies:
            answer = console.post(path, body, {**staff, "Content-Type": content_type})
            assert answer.status == status, (path, content_type, answer)
            conforms("POST", path, answer.status, answer.content_type, answer.body)


# --- the document -------------------------------------------------------------------------------


def api_patterns() -> list[str]:
    """Every URL pattern of the console under ``/api/``, as an OpenAPI path (``<str:x>`` → ``{x}``)."""
    found: list[str] = []

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif route.startswith("api/"):
                found.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))

    walk(get_resolver().url_patterns, "")
    return found


def test_the_document_is_valid_openapi() -> None:
    loaded = schemathesis.openapi.from_dict(document())
    results = list(loaded.get_all_operations())
    assert [result.err() for result in results if isinstance(result, Err)] == []
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) >= 10
    assert document()["openapi"].startswith("3.")


def test_every_api_url_pattern_is_in_the_document() -> None:
    patterns = api_patterns()
    assert "/api/state" in patterns and "/api/partitions/{partition_id}" in patterns
    missing = sorted(set(patterns) - set(document()["paths"]))
    assert not missing, f"API URLs without an OpenAPI description in dashboard/web/openapi.py: {missing}"


@pytest.mark.django_db
def test_the_schema_is_served_under_the_read_rule(client: Client, settings: LazySettings) -> None:
    served = client.get("/api/schema")
    assert served.status_code == 200 and served["Content-Type"] == "application/json"
    assert served.json() == document()
    conforms_response("GET", "/api/schema", served)

    settings.LEASEBOARD_ANONYMOUS_READ = False
    refused = client.get("/api/schema")
    assert refused.status_code == 401 and set(refused.json()) >= {"error", "login"}


@pytest.mark.django_db
def test_more_query_fields_than_django_parses_are_a_documented_400(client: Client, settings: LazySettings) -> None:
    settings.DEBUG = True  # the console's default: Django's debug page read the query again and failed (500)
    many = "&".join(f"p{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    for path in ("/api/state", "/api/events", "/api/audit", "/api/pipeline", "/api/schema", "/metrics"):
        response = client.get(f"{path}?{many}")
        assert response.status_code == 400, (path, response.status_code)
        conforms_response("GET", f"{path}?{many}", response)


@pytest.mark.django_db
def test_with_anonymous_reading_off_every_api_answers_the_documented_401(
    client: Client, settings: LazySettings
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    for path, operations in document()["paths"].items():
        if not path.startswith("/api/"):
            continue  # /metrics is open to Prometheus (access.OPEN)
        url = path.replace("{partition_id}", "0")
        for method in operations:
            response = client.generic(method.upper(), url)
            assert response.status_code == 401, (method, url, response.status_code)
            conforms_response(method.upper(), url, response)
