"""The console's state and its feed: the typed state built once (``console``) and read from the
stores (``state``), the lag status (``lag``), capacity (``capacity``), the monitor that samples a hub
and pushes deltas (``monitor``, ``delta``, ``host``), balancer events recorded and broadcast
(``broadcast``, ``layers``), history read from the event log (``history``), outages (``health``),
enqueue times (``enqueued``) and the ``/metrics`` families (``metrics``)."""
