from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Leaseboard dashboard (control plane)"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (the console's own check rules)
        from .control import logins  # noqa: F401  (its signal receivers: refused logins counted)
