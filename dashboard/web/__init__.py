"""The console's doors: the HTTP views (``views``, ``pipeline``, ``openapi`` and the URL patterns in
``urls``), the websocket (``consumers``, ``routing``), and what stands before every request and
socket: who may read (``access``), the methods and query sizes a read takes (``methods``), and the
503 while the database or the store is down (``degrade``)."""
