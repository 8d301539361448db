#!/usr/bin/env python
"""Django's command-line utility for Leaseboard."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A bad setting (e.g. LEASEBOARD_INTERVAL=abc): one line saying what to fix, not a traceback.
        sys.exit(f"Error: {exc}")


if __name__ == "__main__":
    main()
