"""The Redis store's layout: the keys of one hub and consumer group, and the Lua scripts that change
them atomically on the server (see ``balancer.stores.redis`` for why each is a script).

Pure text: the adapter (``balancer.stores.redis.store``) and the race's (``balancer.race.redis``) send them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

from balancer.model import HubRef

_SAFE = "$.-_~"  # kept as they are in a scope; everything else (braces too) is percent-encoded


# keys ----------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)  # every command of every cycle names its keys: quoted once per hub and group
def scope(ref: HubRef) -> str:
    """``leaseboard:{<namespace>/<hub>/<consumer group>}``: the prefix of every key of ``ref``."""
    parts = "/".join(quote(part, safe=_SAFE) for part in (ref.namespace, ref.hub, ref.consumer_group))
    return f"leaseboard:{{{parts}}}"


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one hub and consumer group."""

    ownership: str
    checkpoints: str
    members: str
    controls: str
    etags: str  # the hub's write counter: part of every ETag, and the change number of every write
    changes: str  # sorted set: partition -> the change number of its record's latest write
    epoch: str  # when the counter started: a cursor of another epoch reads everything again
    # Sorted set: partition -> the change number of its record's latest write that was no renewal
    # (it changed the owner or the owner level): what a reader that leaves renewals out reads by.
    owner_changes: str
    modified: str  # sorted set: partition -> its record's "modified" (the server's clock, seconds)

    @classmethod
    @lru_cache(maxsize=1024)  # a classmethod: the cache holds no instance alive
    def of(cls, ref: HubRef) -> Keys:
        prefix = scope(ref)
        names = (
            "ownership",
            "checkpoints",
            "members",
            "controls",
            "etags",
            "changes",
            "epoch",
            "owner_changes",
            "modified",
        )
        return cls(*(f"{prefix}:{name}" for name in names))


# scripts -------------------------------------------------------------------------------------

# The server's clock as "<seconds>.<microseconds>": a string, as Lua's JSON encoder would round a
# number to 14 digits and lose the microseconds an ETag and an expiry are compared on.
_NOW = "local t = redis.call('TIME')\nlocal now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))\n"

# A stored ownership record as a listing reads it, nil when it names no owner (not a JSON object, or
# its "owner" is no string). An "etag" that is no non-empty string (a hand edit) reads as the one a
# listing shows for it: "corrupt-" and the SHA-1 of the whole stored value (``flaws.made_up_etag``).
_READ = """
local function made_up(value)
  return 'corrupt-' .. redis.sha1hex(value)
end
local function read(value)
  if not value then return nil end
  local ok, record = pcall(cjson.decode, value)
  if not (ok and type(record) == 'table' and type(record.owner) == 'string') then return nil end
  if type(record.etag) ~= 'string' or record.etag == '' then record.etag = made_up(value) end
  return record
end
"""

# KEYS: ownership, etags, changes, epoch, owner_changes, modified. ARGV: (partition, owner, ETag expected
# or '', owner level) per record. Returns {now, {{n, new ETag}, ...}} for the records won, n counting
# records from 1. Every record won takes the next number of the hub's counter as its change number
# (scripts run one at a time, so the numbers are in the order of the writes), and as its owner-change
# number unless it is a renewal (the stored record has the owner and level written); its time goes to
# ``modified``. The counter's epoch is set whenever the counter starts again (a FLUSHALL, a restart
# without persistence) or has none.
CLAIM = (
    _NOW
    + _READ
    + """
local won = {}
local serial = 0
for i = 1, #ARGV, 4 do
  local pid, owner, expected, level = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local current = redis.call('HGET', KEYS[1], pid)
  local record = read(current)
  -- a first claim wins where there is no record, or only an unreadable one; any other claim
  -- only while the stored ETag is still the one the caller saw, or while the stored value is still
  -- the very one whose made-up ETag it carries (one a listing could not read, or read in part)
  local wins
  if expected == '' then
    wins = (record == nil)
  else
    wins = (record ~= nil and record.etag == expected)
      or (current and string.sub(expected, 1, 8) == 'corrupt-' and expected == made_up(current))
  end
  if wins then
    serial = redis.call('INCR', KEYS[2])
    if serial == 1 or redis.call('EXISTS', KEYS[4]) == 0 then redis.call('SET', KEYS[4], now .. '-' .. serial) end
    local etag = now .. '-' .. serial
    redis.call('HSET', KEYS[1], pid,
      cjson.encode({owner = owner, etag = etag, modified = now, level = tonumber(level)}))
    redis.call('ZADD', KEYS[3], serial, pid)
    if not (record ~= nil and record.owner == owner and tonumber(record.level or 0) == tonumber(level)) then
      redis.call('ZADD', KEYS[5], serial, pid)
    end
    redis.call('ZADD', KEYS[6], now, pid)
    won[#won + 1] = {(i + 3) / 4, etag}
  end
end
return {now, won}
"""
)

# KEYS: ownership, changes, etags, epoch, members, controls, owner_changes, modified. ARGV: the epoch and
# change number a cursor read up to ('' and '': none), and '' or ``stale_after`` (seconds). Returns
# {seconds, microseconds, epoch, counter, full (1/0), records in the ownership hash, ownership (flat
# field/value pairs), members (flat), controls (flat), fresh after ('' or the server's clock less
# ``stale_after``)}: the ownership records written after the cursor, or all of them (full) when the
# cursor is of another epoch, or past the counter (it went back), or names a record that is gone
# (deleted by hand). With ``stale_after`` renewals are left out: the records whose owner changed after
# the cursor, and those last modified before "fresh after". A hub written before ``owner_changes`` and
# ``modified`` were kept (their sizes differ from the hash's) is read with every write (fresh after
# ''); the next full read fills them from the records. ARGV[4] and ARGV[5] are the digests of the
# members' and the controls' hashes as the cursor's read found them: each comes back as {fields (flat),
# digest}, the fields empty when the hash is as it was (a heartbeat, a control put or deleted, through
# the store or by hand, changes it; a hash that only rehashed is read again, no harm).
CHANGES = """
local t = redis.call('TIME')
local epoch = redis.call('GET', KEYS[4]) or ''
local counter = tonumber(redis.call('GET', KEYS[3]) or '0')
local full = ARGV[1] == '' or ARGV[1] ~= epoch or tonumber(ARGV[2]) == nil or tonumber(ARGV[2]) > counter
local ownership = {}
local size = redis.call('HLEN', KEYS[1])
local quiet = ARGV[3] ~= '' and redis.call('ZCARD', KEYS[7]) == size and redis.call('ZCARD', KEYS[8]) == size
local fresh_after = ''
if not full then
  local pids
  if quiet then
    fresh_after = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[3]))
    pids = redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. ARGV[2], '+inf')
    local listed = {}
    for _, pid in ipairs(pids) do listed[pid] = true end
    for _, pid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', '(' .. fresh_after)) do
      if not listed[pid] then pids[#pids + 1] = pid end
    end
  else
    pids = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf')
  end
  for start = 1, #pids, 500 do
    local batch = {unpack(pids, start, math.min(start + 499, #pids))}
    local values = redis.call('HMGET', KEYS[1], unpack(batch))
    for i, pid in ipairs(batch) do
      if not values[i] then full = true break end
      ownership[#ownership + 1] = pid
      ownership[#ownership + 1] = values[i]
    end
    if full then break end
  end
end
if full then
  ownership = redis.call('HGETALL', KEYS[1])
  if ARGV[3] ~= '' and not quiet then
    -- kept since the hub was first written by an older version: fill from the records, whose owner
    -- changes count as made at this counter (the next reads list each once more, no harm)
    redis.call('DEL', KEYS[7], KEYS[8])
    for i = 1, #ownership, 2 do
      local ok, record = pcall(cjson.decode, ownership[i + 1])
      local modified = ok and type(record) == 'table' and tonumber(record.modified) or 0
      redis.call('ZADD', KEYS[7], counter, ownership[i])
      redis.call('ZADD', KEYS[8], modified, ownership[i])
    end
  end
end
if full then fresh_after = '' end
local function small(key, seen)
  local all = redis.call('HGETALL', key)
  local digest = redis.sha1hex(table.concat(all, '\\0'))
  if not full and digest == seen then return {{}, digest} end
  return {all, digest}
end
return {t[1], t[2], epoch, tostring(counter), full and 1 or 0, size, ownership,
  small(KEYS[5], ARGV[4]), small(KEYS[6], ARGV[5]), fresh_after}
"""

# KEYS: ownership, checkpoints. ARGV: partition, owner, checkpoint JSON without "modified", "1" when
# the checkpoint may go back (an operator's reset). Returns {1, now} when written, {0, current owner
# or ''} when the caller does not own it, {2, stored sequence} for a write that would move it back:
# a stale one, sent before its worker was cut off and delivered by TCP after the heal, when that
# worker holds the partition again (the owner's name alone cannot tell the two apart).
CHECKPOINT = (
    _NOW
    + _READ
    + """
local record = read(redis.call('HGET', KEYS[1], ARGV[1]))
local holder = ''
if record then holder = record.owner end
if ARGV[2] == '' or holder ~= ARGV[2] then return {0, holder} end
local checkpoint = cjson.decode(ARGV[3])
local stored = redis.call('HGET', KEYS[2], ARGV[1])
if stored and ARGV[4] ~= '1' then
  local ok, old = pcall(cjson.decode, stored)
  local before = ok and type(old) == 'table' and tonumber(old.sequence)
  if before and tonumber(checkpoint.sequence) < before then return {2, tostring(old.sequence)} end
end
checkpoint.modified = now
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(checkpoint))
return {1, now}
"""
)

# KEYS: one hash. ARGV: field, JSON object, name of the time field to add. Returns now.
STAMPED = (
    _NOW
    + """
local value = cjson.decode(ARGV[2])
value[ARGV[3]] = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(value))
return now
"""
)
