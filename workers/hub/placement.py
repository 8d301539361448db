"""Where Event Hubs puts an event with a partition key: Jenkins' lookup3 ``hashlittle2`` over the key.

The Azure SDKs' buffered producers compute the service's placement on the client (so that keyed
events sent partition by partition land where the service would have put them): the key's
characters, each taken as one unit (its code point), are hashed with ``hashlittle2`` seeded with
zero; the two 32-bit results are XORed, the low 16 bits read as a signed short, and the partition
is ``abs(hash % count)`` with Python's modulo (as the Python SDK computes it). An empty key hashes
to 0. Written here from the published algorithm (Bob Jenkins, lookup3.c, public domain).
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = ((a - c) & _MASK) ^ _rot(c, 4)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 6)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 8)
    b = (b + a) & _MASK
    a = ((a - c) & _MASK) ^ _rot(c, 16)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 19)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c = ((c ^ b) - _rot(b, 14)) & _MASK
    a = ((a ^ c) - _rot(c, 11)) & _MASK
    b = ((b ^ a) - _rot(a, 25)) & _MASK
    c = ((c ^ b) - _rot(b, 16)) & _MASK
    a = ((a ^ c) - _rot(c, 4)) & _MASK
    b = ((b ^ a) - _rot(a, 14)) & _MASK
    c = ((c ^ b) - _rot(b, 24)) & _MASK
    return a, b, c


def _word(units: list[int], at: int, count: int = 4) -> int:
    """Up to four units from ``at``, little-endian, each shifted by 8 bits more (a unit over 255
    spills into the next byte, as the SDKs compute it)."""
    return sum(units[at + i] << (8 * i) for i in range(count)) & _MASK


def hashlittle2(units: list[int], seed: int = 0, seed2: int = 0) -> tuple[int, int]:
    """lookup3's ``hashlittle2`` over ``units`` (bytes, or code points); returns (c, b)."""
    length = len(units)
    a = b = c = (0xDEADBEEF + length + seed) & _MASK
    c = (c + seed2) & _MASK
    at, left = 0, length
    while left > 12:
        a = (a + _word(units, at)) & _MASK
        b = (b + _word(units, at + 4)) & _MASK
        c = (c + _word(units, at + 8)) & _MASK
        a, b, c = _mix(a, b, c)
        at, left = at + 12, left - 12
    if left == 0:
        return c, b
    # The last 1..12 units, in words of up to four; the final word may be short.
    a = (a + _word(units, at, min(left, 4))) & _MASK
    if left > 4:
        b = (b + _word(units, at + 4, min(left - 4, 4))) & _MASK
    if left > 8:
        c = (c + _word(units, at + 8, left - 8)) & _MASK
    a, b, c = _final(a, b, c)
    return c, b


def hash_code(partition_key: str) -> int:
    """The signed 16-bit hash Event Hubs places ``partition_key`` by (0 for the empty key)."""
    if not partition_key:
        return 0
    c, b = hashlittle2([ord(ch) for ch in partition_key])
    low = (c ^ b) & 0xFFFF
    return low - 0x10000 if low & 0x8000 else low


def partition_for_key(partition_key: str, partition_count: int) -> int:
    """The partition (0..count-1) an event with ``partition_key`` goes to. Raises ValueError for
    a count under 1."""
    if partition_count < 1:
        raise ValueError(f"a hub has at least one partition, got {partition_count}")
    return abs(hash_code(partition_key) % partition_count)
