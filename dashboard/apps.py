from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Leaseboard dashboard (control plane)"

    def ready(self) -> None:
        from .control import logins  # noqa: F401  (its signal receivers: refused logins on the audit log)
