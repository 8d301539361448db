"""Every hub and consumer group at a glance (the console's groups page and ``/api/groups``).

``everything`` reads every record of the configured namespace from the store at once: one request of
the SQL store, a ``SCAN`` and one pipeline of Redis, one List Blobs (per 5,000 blobs) of Blob Storage
(``sql``, ``redis`` and ``blob`` here: each a reader of one store's layout, none in ``balancer``);
a store without such a reader (the in-memory one) is read hub by hub. ``overview`` turns that one
read into a row per group with the state a fleet page shows (``console.assemble``, with the lag
statuses of the group's monitor or of its newest stored sampling round).
"""
