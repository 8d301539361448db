"""``make bench``'s benchmarks (``run.py``). Importing ``tests.support`` installs its reaper: whatever
a bench starts ends with it, however it ends (``tests.support.reaper``)."""

import tests.support  # noqa: F401
