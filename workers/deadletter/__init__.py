"""Dead letters once set aside (``workers.runtime.deadletters`` writes them): read a page of them,
decode their bodies and properties, send them to the hub again, purge them.

``files``: the files and their locks; ``decode``: what a body and the AMQP sections say;
``replay``: the sending, marked per dead letter so a second replay is refused; ``inplace``: the
requests that hand dead letters to their partition's owner's handler instead.
"""
