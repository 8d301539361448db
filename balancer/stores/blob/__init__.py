"""The Azure Blob Storage store: ownership, checkpoints, heartbeats and controls as empty blobs.

Names and metadata are those of Microsoft's blob checkpoint store (``azure-eventhub-checkpointstoreblob``
and ``-aio``), so its processors and Leaseboard's can share one container (names lowercased whole,
as Microsoft does, so the consumer group ``$Default`` is ``$default`` in a name)::

    <namespace>/<hub>/<consumer group>/ownership/<partition>   metadata: ownerid
    <namespace>/<hub>/<consumer group>/checkpoint/<partition>  metadata: offset, sequencenumber

Leaseboard's own records sit beside them, where Microsoft's processor never lists::

    <prefix>/leaseboard/members/<owner id>            metadata: info (JSON)    heartbeats
    <prefix>/leaseboard/controls/<kind>/<target>      metadata: value          drain, pin, rebalance

(owner ids, targets and values percent-encoded). Data lives in metadata (``002``), so every listing
is ONE List Blobs request with metadata, whatever the number of partitions.

Claims are compare-and-set on the blob's ETag: ``If-Match`` with the ETag seen for a record that
exists, create-if-absent (``If-None-Match: *``) for a partition never owned. A lost race (412, 409, or
404 for a blob that is gone) means "not won"; every other failure is raised as StoreUnavailable
(the service cannot be reached or answers 5xx) or StoreError (refused credentials, a deleted
container, a request the service rejects), never swallowed.

Clock: expiry is judged by the *service's* clock. ``last_modified`` is the blob's Last-Modified and
``now()`` is the Date header of the latest response plus the whole seconds elapsed on this machine's
monotonic clock since it arrived. Both have one-second resolution and both are truncated, so
``now()`` never runs ahead of a Last-Modified the service writes later, and no request is spent on
the clock. A worker whose wall clock is minutes off judges leases exactly as the others do.

Requests: a listing 1, a claim 1 per record (sent concurrently), a checkpoint 2 (read the ownership
blob, write the checkpoint if its ETag is still the one this store wrote; 3 the first time, reading
that ETag too), a heartbeat or control 1, ``now()`` none. A steady cycle of the
cooperative strategy is 4 + the partitions held (list, heartbeat, list members, list controls, one
renewal each); Microsoft's processor spends 1 + the partitions held.

A blob that cannot be read (metadata missing or malformed: a hand edit, an older layout) is skipped,
logged by name once, and listed in ``corrupt``; an unreadable ownership blob is overwritten by the
next claim of its partition, so it cannot block that partition forever.

The only extra key Leaseboard ever writes into Microsoft's metadata is ``ownerlevel``, and only when
an owner level other than 0 is claimed; Microsoft's processor ignores it (and drops it when it claims).

The parts: ``layout`` has the names and the reading of each blob's metadata (no SDK), ``service``
the container as the SDK reaches it (clients, errors, the service's clock), ``checkpoints`` the
conditional checkpoint write (and the race it closes); ``store`` is the store's operations on them.
"""
