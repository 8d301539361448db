"""The Redis store: ownership, checkpoints, heartbeats and controls in Redis hashes.

Keys (one hash per kind of record, so every listing is ONE ``HGETALL``)::

    leaseboard:{<namespace>/<hub>/<consumer group>}:ownership    partition -> {"owner", "etag", "modified", "level"}
    leaseboard:{...}:checkpoints                                 partition -> {"sequence", "offset", "modified"}
    leaseboard:{...}:members                                     owner id  -> {"seen", "info"}
    leaseboard:{...}:controls                                    "<kind>/<target>" -> {"value", "created"}
    leaseboard:{...}:etags                                       counter, part of every ETag

The scope in braces is a Redis Cluster hash tag: every key of one hub and consumer group lives in
one slot, so the scripts (some touch two keys at once) would run on a cluster too. Scope parts are
percent-encoded, so no name can contain a brace and widen or split the tag. Every script receives
its keys in ``KEYS`` and touches nothing else; a test runs the store as an ACL user allowed only
one scope's keys to prove it. The parts: ``layout`` has the keys and the scripts, ``records`` the
reading of each record, ``connection`` the clients (one per event loop) and the round trip every
command takes, ``notices`` the release notices on pub/sub; ``store`` is the store's operations,
sending them.

Compare-and-set runs on the server, in Lua: a claim compares the stored ETag and writes in one
atomic step, and a checkpoint is written only while the ownership record names the caller (the
same script reads one key and writes the other, so no claim can land in between). Times are the
server's: each script reads Redis ``TIME`` for ``modified``/``seen``/``created``, ``now()`` is
``TIME`` too, so expiry is judged by one clock whatever the workers' clocks say. Times are kept
as decimal strings with microseconds (Lua's JSON encoder would round a number to 14 digits).
ETags are ``<server time>-<counter>``: unique even after a restart without persistence resets
the counter, so an ETag seen before a restart can never match a record written after it.

Errors: a Redis that cannot be reached (refused, reset, timed out, still loading) raises
StoreUnavailable naming host, port and database, never the password; refused credentials or a
command the server rejects (an ACL, a read-only replica) raise StoreError. A hand-edited record
costs only itself (``balancer.stores.flaws``): one whose time is not a finite number is listed with
None (an ownership record so is expired), one whose ETag is no non-empty string with a made-up one
naming its stored value (the claim script makes up the same), so the claim carrying the listed ETag
replaces it; one that cannot be read at all (not JSON, no owner, no partition id, a member without
a ``seen`` time, a checkpoint without a sequence number: read as absent, so its partition resumes
from the processor's starting position rather than stalling, and its owner's next checkpoint
rewrites it) is skipped, and a first claim may overwrite an unreadable ownership record, so it
never blocks its partition. Each is logged once, as a warning, and listed in ``corrupt``.

One ``RedisStore`` may be used from several event loops (a management command after another, a
test's threads): each loop gets its own client and connection pool.
"""
