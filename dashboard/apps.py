from typing import Any

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Leaseboard dashboard (control plane)"

    def ready(self) -> None:
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_login_failed

        from . import checks  # noqa: F401  (the console's own check rules)

        # Refused logins are counted (control/logins.py). The receivers are connected here, where they
        # always were (after django-axes' own, which mark a locked-out request), but the counting code
        # (models, metrics, the console's state) is imported at the first refusal, not at every start
        # of a process that serves no login: `runworkers`, `runhub`, the pipeline's commands.
        user_login_failed.connect(_wrong_password, dispatch_uid="leaseboard.wrong_password")
        user_locked_out.connect(_locked_out, dispatch_uid="leaseboard.locked_out")


def _wrong_password(sender: Any, **kwargs: Any) -> None:
    from .control import logins

    logins.wrong_password(sender, **kwargs)


def _locked_out(sender: Any, **kwargs: Any) -> None:
    from .control import logins

    logins.locked_out(sender, **kwargs)
