"""The event-processor runtime: one EventProcessor per worker (processor.py), a pump per owned
partition (pump.py), and the sink that reports balancer events (sink.py)."""
