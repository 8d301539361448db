"""What tests share, one home for each concept:

- ``waiting``: ``until`` / ``until_sync``, the one way to wait: poll a condition with a deadline.
- ``clock``: ``FakeClock``, time that moves only when a test says so.
- ``servers``: ``ServerProcess``, the one way to run a real server (free port, ready, retried on a
  port clash, ended with its process group); ``postgres``, ``redis_server`` and ``azurite`` are its
  kinds.
- ``databases``: Django aliases added at run time for such a server or a process's SQLite file.
- ``processes``: real ``manage.py`` processes of end-to-end tests, started, awaited and killed.
- ``reaper``: nothing a run started outlives it, even killed (installed below, on import).
"""

from tests.support import reaper

# Every process a test run or a bench starts ends with it, however it ends (tests.support.reaper):
# here, so that every process that uses this package (each pytest process: tests/conftest.py
# imports it; each bench: tests/benchmarks/__init__.py) does so from its first child on.
reaper.install()
