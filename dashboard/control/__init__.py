"""The control plane's admin actions: drain, undrain, pin, unpin, rebalance, reset a checkpoint, purge,
replay and purge dead letters.

``registry.py`` declares every action once (``action.Action``: its arguments and their checks, its
dry run, what it writes); the views, the management commands (``command.py``), the page's dialog,
the audit (``audit.py``) and the metrics iterate over it. ``actions.py`` holds the two entry points,
``preview`` and ``apply``; ``fleet.py`` reads the fleet and the strategy it runs; ``forecast.py``
plans the moves with that strategy's own planning function; ``records.py``, ``resets.py`` and
``deadletters.py`` hold the actions themselves.
"""
