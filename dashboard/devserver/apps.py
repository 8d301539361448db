from django.apps import AppConfig


class DevServerConfig(AppConfig):
    name = "dashboard.devserver"
    label = "leaseboard_devserver"
    verbose_name = "runserver under Daphne"
