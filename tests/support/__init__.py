"""What tests share, one home for each concept:

- ``waiting``: ``until`` / ``until_sync``, the one way to wait: poll a condition with a deadline.
- ``clock``: ``FakeClock``, time that moves only when a test says so.
- ``servers``: ``ServerProcess``, the one way to run a real server (free port, ready, retried on a
  port clash, ended with its process group); ``postgres``, ``redis_server`` and ``azurite`` are its
  kinds.
- ``databases``: Django aliases added at run time for such a server or a process's SQLite file.
- ``processes``: real ``manage.py`` processes of end-to-end tests, started, awaited and killed.
"""
