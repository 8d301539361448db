"""The embedded hub: partition logs on disk (log.py), their readers (reader.py), the event source over
them (embedded.py), and the AMQP server that lets Microsoft's SDK read and write them (amqp/)."""
