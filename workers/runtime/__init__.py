"""The event-processor runtime: one EventProcessor per worker (processor.py: its cycles, renewals and
waits; waiting.py: each wait; pumps.py: its pumps; handoffs.py: its planned moves away; outages.py:
what it logs once per outage), run by runner.py until a signal; a pump per owned partition (pump.py:
its loop and its lease; handling.py: handler calls, retries and dead letters; idle.py: its waits;
lane.py and syncwork.py: its thread and the per-event loop there; checkpoints.py, sequence.py,
deadletters.py, config.py: its policies), and the sink that reports balancer events (sink.py)."""
