#!/usr/bin/env python
"""Django's command-line utility for GRUE Studio (``python manage.py up`` starts everything)."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except KeyboardInterrupt:
        # Ctrl-C while Django loads (before a command handles it): a line, not a traceback; 130 is
        # the shell's status for a process ended by SIGINT.
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
