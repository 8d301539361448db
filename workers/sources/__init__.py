"""Event sources: the protocol every source implements (base.py) and Azure Event Hubs (eventhubs/);
the embedded hub's source is ``workers.hub.embedded``."""
