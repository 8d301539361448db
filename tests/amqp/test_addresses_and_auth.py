"""Link addresses, starting-position filters, and shared access signatures as the SDKs write them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from azure.eventhub._pyamqp.utils import generate_sas_token
from proton import Described, symbol

from workers.hub.amqp.addresses import Address, BadAddress, StartAt, parse_address, parse_filter
from workers.hub.amqp.auth import AuthError, Grant, SasKey, verify
from workers.hub.amqp.keys import ENV_KEY, KEY_FILE, KeyFileError, load_key


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("$cbs", Address("cbs")),
        ("$management", Address("management")),
        ("amqps://127.0.0.1:5672/sensors", Address("hub", "sensors")),
        ("amqps://127.0.0.1:5672/sensors/Partitions/3", Address("partition", "sensors", "3")),
        ("sensors/partitions/3", Address("partition", "sensors", "3")),
        (
            "amqps://127.0.0.1:5672/sensors/ConsumerGroups/$Default/Partitions/0",
            Address("consumer", "sensors", "0", "$Default"),
        ),
    ],
)
def test_addresses_the_sdks_write_are_understood(address: str, parsed: Address) -> None:
    assert parse_address(address) == parsed


@pytest.mark.parametrize(
    "address", ["", "amqps://host/", "sensors/Partitions", "sensors/ConsumerGroups/x", "a/b/c/d/e/f"]
)
def test_other_addresses_are_not_found(address: str) -> None:
    with pytest.raises(BadAddress) as bad:
        parse_address(address)
    assert bad.value.condition == "amqp:not-found"


def test_entities_are_what_a_token_must_cover() -> None:
    assert parse_address("Sensors/ConsumerGroups/$Default/Partitions/0").entity == "sensors/consumergroups/$default"
    assert parse_address("Sensors/Partitions/0").entity == "sensors"


def selector(expression: str) -> dict[object, object]:
    name = symbol("apache.org:selector-filter:string")
    return {name: Described(name, expression)}


@pytest.mark.parametrize(
    ("expression", "start"),
    [
        ("amqp.annotation.x-opt-offset > '-1'", StartAt("offset", "-1", False)),
        ("amqp.annotation.x-opt-offset >= '1234'", StartAt("offset", "1234", True)),
        ("amqp.annotation.x-opt-offset > '@latest'", StartAt("offset", "@latest", False)),
        ("amqp.annotation.x-opt-sequence-number > '41'", StartAt("sequence", "41", False)),
        ("amqp.annotation.x-opt-enqueued-time >= '1700000000000'", StartAt("time", "1700000000000", True)),
    ],
)
def test_selector_filters_become_starting_positions(expression: str, start: StartAt) -> None:
    assert parse_filter(selector(expression)) == start


def test_no_filter_is_the_start_and_a_filter_we_cannot_apply_is_refused() -> None:
    assert parse_filter(None) == StartAt.earliest()
    for bad in ("amqp.annotation.x-opt-offset < '5'", "amqp.annotation.x-opt-offset > 'abc'", "1 = 1"):
        with pytest.raises(BadAddress) as refused:
            parse_filter(selector(bad))
        assert refused.value.condition == "amqp:invalid-field"


def test_a_token_signed_by_the_sdk_is_verified_and_covers_what_is_below_it() -> None:
    key = SasKey("RootManageSharedAccessKey", "c2VjcmV0LWtleS1mb3ItdGVzdHM=")
    now = time.time()
    token = generate_sas_token("sb://127.0.0.1:5672/sensors", key.name, key.key, int(now) + 60)
    grant = verify(token, key, now)
    assert grant.path == "sensors"
    assert grant.covers("sensors", now) and grant.covers("sensors/consumergroups/$default", now)
    assert not grant.covers("sensors2", now) and not grant.covers("sensors", now + 61)
    assert Grant("", now + 60).covers("anything/below", now)
    assert verify(key.sign("sb://h/sensors", int(now) + 60), key, now).path == "sensors"


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda t, k: t.replace("se=", "se=1"), "not valid"),
        (lambda t, k: generate_sas_token("sb://h/x", k.name, "other", 2_000_000_000), "not valid"),
        (lambda t, k: generate_sas_token("sb://h/x", "Other", k.key, 2_000_000_000), "unknown shared access policy"),
        (lambda t, k: generate_sas_token("sb://h/x", k.name, k.key, 1000), "expired"),
        (lambda t, k: "Bearer abc", "not a shared access signature"),
        (lambda t, k: t.replace("&sig=", "&nosig="), "lacks"),
    ],
    ids=["tampered", "other-key", "other-policy", "expired", "not-sas", "no-signature"],
)
def test_tokens_that_grant_nothing_are_refused_without_quoting_a_secret(mangle: object, message: str) -> None:
    key = SasKey("RootManageSharedAccessKey", "c2VjcmV0LWtleS1mb3ItdGVzdHM=")
    good = generate_sas_token("sb://h/x", key.name, key.key, 2_000_000_000)
    token = mangle(good, key)  # type: ignore[operator]
    with pytest.raises(AuthError) as refused:
        verify(token, key, time.time())
    assert message in str(refused.value)
    assert key.key not in str(refused.value) and "sig=" not in str(refused.value)
    assert key.key not in repr(key)


def test_the_key_comes_from_the_environment_or_a_private_file_made_once(tmp_path: Path) -> None:
    var = tmp_path
    assert load_key(var, {ENV_KEY: "from-env"}) == (SasKey("RootManageSharedAccessKey", "from-env"), f"${ENV_KEY}")
    assert not (var / KEY_FILE).exists()
    made, where = load_key(var, {})
    assert where == str(var / KEY_FILE) and (var / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert load_key(var, {}) == (made, where)  # the same key on the next start
    (var / KEY_FILE).chmod(0o644)
    with pytest.raises(KeyFileError, match="readable by others"):
        load_key(var, {})
