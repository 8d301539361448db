"""The event-processor runtime: one EventProcessor per worker (processor.py), a pump per owned
partition (pump.py: its loop, retries and dead letters; lane.py and syncwork.py: its thread and
the per-event loop there; checkpoints.py, sequence.py, deadletters.py, config.py: its policies),
and the sink that reports balancer events (sink.py)."""
