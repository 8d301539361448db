"""The console's doors. HTTP: the pages (``pages``), the read API (``api``, and every group at once:
``groups``), the admin actions' endpoints (``actions``), ``/metrics`` (``scrape``), the pipeline's
page and API (``pipeline``), the dead letters' (``deadletters``) and the OpenAPI document
(``openapi``, built from ``schemas``), routed by
``urls``; what they share is in ``common``. The websocket: ``consumers``, routed by ``routing``.
Before every request and socket: who may read (``access``), the methods and query sizes a read
takes (``methods``), and the 503 while the database or the store is down (``degrade``)."""
