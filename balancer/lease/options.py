"""The lease coordinator's fixed shares and margins: when a lease is renewed, retried and read again.

Each is a share of the lease expiry (or a count of cycles), so the schedule scales with the expiry
whatever the balancing interval.
"""

from __future__ import annotations

# Renewal with renewal steps (``Coordinator.renewal_steps``: the driver calls ``renew()`` at
# ``next_renewal()`` between cycles): a lease is renewed once RENEW_SHARE of the expiry has passed since
# the send time of its last winning write, at that moment, whatever the balancing interval; every 6.5 s
# at a 10 s expiry, 19.5 s at 30 s. A renewal that fails (the store cannot be reached, or a cycle failed)
# is tried again RETRY_SHARE of the expiry later, the wait doubling, while the lease still holds (at
# 10 s: at 6.5, 7 and 8 s; cycles go on trying too, and the pumps pause at 10 s until one succeeds). A
# renewal also takes every lease at least GATHER as old as a due one, so leases claimed a cycle or two
# apart are renewed by one write from then on (one round trip on SQL and Redis).
RENEW_SHARE, RETRY_SHARE, GATHER = 0.65, 0.05, 0.5
# A strategy that judges expiry by the worker's own clock (``Strategy.store_clock`` False: ``balanced``,
# ``greedy``, ``eph``) takes a record for expired when its age by that clock passes the expiry, so a
# worker whose clock runs S seconds ahead sees every lease S seconds older: renewed at 65 % of the
# expiry they tolerated 63 s of skew at 30 s / 180 s and churned at +100 s. Renewed at a quarter of the
# expiry, they tolerate three quarters of it (135 s at 180 s), about what renewing every cycle gave.
CLOCK_RENEW_SHARE = 0.25
EARLY = 1e-3  # seconds: a renewal step woken this much early (timer resolution) still finds its lease due
# Renewal without renewal steps (cycles alone renew): a lease is renewed once half the expiry has
# passed since its last renewal, or sooner if waiting one more cycle and then failing once
# (RETRY_CYCLES late cycles, timer jitter included) could let it lapse. At the defaults (10 s interval,
# 30 s expiry) that is every cycle; at 2 s and 10 s every third. With no interval known, every cycle.
RETRY_CYCLES, LATE = 2, 1.1
# Reading what changed (``balancer.changes``) without other workers' renewals: a store that can leaves
# them out, and lists instead every record not written for STALE_SHARE of the expiry (at least 0.1
# more than the renewal share, at most 0.9), so a record a live worker renews is never read again
# while one whose owner stopped is read, with its current ETag, before it can be judged expired.
STALE_SHARE, STALE_MAX = 0.85, 0.9
