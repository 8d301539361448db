"""Keys are placed as Azure places them: our lookup3 against the SDK's own buffered-producer resolver.

The Azure SDK's buffered producer computes the service's placement on the client; its resolver is
the reference here (imported by the test only: production code has its own implementation)."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver, generate_hash_code

from workers.hub.embedded import EmbeddedHub
from workers.hub.placement import hash_code, hashlittle2, partition_for_key

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " éüß中文😀\u0000\uffff"


def keys(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    # Every length from 0 to 40 (the 12-unit blocks of lookup3 and each short tail), then random ones.
    fixed = ["".join(rng.choice(ALPHABET) for _ in range(n)) for n in range(41)]
    return fixed + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 120))) for _ in range(count)]


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 100, 1024])
def test_keys_go_where_the_sdks_buffered_producer_puts_them(partitions: int) -> None:
    resolver = PartitionResolver([str(i) for i in range(partitions)])
    for key in keys(2000, partitions):
        assert str(partition_for_key(key, partitions)) == resolver.get_partition_id_by_partition_key(key), key


def test_the_hash_code_is_the_sdks_signed_short() -> None:
    for key in keys(3000, 7):
        assert hash_code(key) == generate_hash_code(key), key
    assert hash_code("") == 0


def test_hashlittle2_matches_the_published_test_vectors() -> None:
    # From lookup3.c's driver5(): hashlittle2 of "" with seeds (0,0), (0,0xdeadbeef), (0xdeadbeef,0xdeadbeef).
    assert hashlittle2([], 0, 0) == (0xDEADBEEF, 0xDEADBEEF)
    assert hashlittle2([], 0, 0xDEADBEEF) == (0xBD5B7DDE, 0xDEADBEEF)
    assert hashlittle2([], 0xDEADBEEF, 0xDEADBEEF) == (0x9C093CCD, 0xBD5B7DDE)
    units = list(b"Four score and seven years ago")
    assert hashlittle2(units, 0, 0) == (0x17770551, 0xCE7226E6)
    assert hashlittle2(units, 0, 1) == (0xE3607CAE, 0xBD371DE4)
    assert hashlittle2(units, 1, 0) == (0xCD628161, 0x6CBEA4B3)


def test_the_embedded_hub_places_keys_alike(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=5)
    resolver = PartitionResolver([str(i) for i in range(5)])
    for key in keys(200, 3)[1:]:
        assert hub.send(b"x", partition_key=key[:60]).partition_id == resolver.get_partition_id_by_partition_key(
            key[:60]
        )


def test_a_partition_count_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for_key("k", 0)
