"""The SQL store (``store.SqlStore``: ownership, checkpoints, members and controls on the Django ORM,
SQLite and PostgreSQL), beside its tables in ``dashboard.models``.

``store`` is the protocols' surface; ``lanes`` its threads and connections, ``reads`` the snapshot
and the changes since a cursor, ``claims`` and ``update`` the compare-and-set writes, ``rows`` the
listings read without model instances, ``namespace`` every hub's records at once (the console's
groups page), ``clock`` the store's clock, ``notices`` release notices on PostgreSQL's
``LISTEN/NOTIFY``.
"""
