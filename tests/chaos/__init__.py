"""The fault-injection suite: real ``runworkers`` processes on every store that exists, faults
injected while a producer writes a known, numbered event set, and an invariant checker over what
the workers recorded and what the store said while they ran.

``test_chaos`` runs it (marked slow: ``make test`` runs the short version, one pass of each fault);
``CHAOS_SECONDS=N`` (``make chaos``) keeps injecting random faults for N seconds per store.
``invariants`` is the checker (over ``evidence``, by ``rules``, with ``figures``), pure and tested
on its own (``test_invariants``); ``fleet`` drives the processes, ``stores`` starts and breaks the
stores, ``recording`` is the handler the workers run.
"""
