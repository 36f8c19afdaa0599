"""Make sure an admin account exists; print its password only when it was just created."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account (GRUE_ADMIN_USER / GRUE_ADMIN_PASSWORD, else admin + a random password)."

    def handle(self, *args: Any, **opts: Any) -> None:
        User = get_user_model()
        for name in ("researcher", "annotator"):
            Group.objects.get_or_create(name=name)
        username = os.environ.get("GRUE_ADMIN_USER") or "admin"
        password = os.environ.get("GRUE_ADMIN_PASSWORD")
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"admin account: {username} (exists; password unchanged)")
            return
        if not password and User.objects.filter(is_superuser=True).exists():
            self.stdout.write("admin account: an administrator exists already")
            return
        generated = not password
        password = password or secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username, "", password)
        user.groups.add(Group.objects.get(name="researcher"))
        if generated:
            self.stdout.write(
                f"admin account created: {username} / {password}   (shown once; change it in /admin/)"
            )
        else:
            self.stdout.write(f"admin account created: {username} (password from GRUE_ADMIN_PASSWORD)")
