"""``manage.py runserver`` under Daphne (ASGI, so the console's websockets work in development).

Daphne's own app (``"daphne"`` in ``INSTALLED_APPS``) imports ``daphne.server`` when Django starts,
which imports Twisted and installs its asyncio reactor in every process: about 0.2 s of CPU at each
start of ``runworkers``, ``runhub`` or ``runpipeline``, none of which serves HTTP. This app gives the
same ``runserver`` and imports Daphne only when that command runs. It must come before
``django.contrib.staticfiles`` in ``INSTALLED_APPS`` (whose ``runserver`` it replaces).
"""
