"""The errors every annotation module raises; their messages are safe to show to the user.

In a module of their own so that campaigns, uploads, assignment and invites can all raise them
without importing each other, and views can catch one base class.
"""

from __future__ import annotations


class AnnotationError(Exception):
    """A request the service refuses; the message is safe to show to the user."""


class UploadError(AnnotationError):
    """A bad upload, located: the message starts with the line and field it is about."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None):
        where = f"line {line}" if line else ""
        if field:
            where += f"{', ' if where else ''}field '{field}'"
        super().__init__(f"{where}: {message}" if where else message)
        self.line, self.field = line, field


class Rejected(AnnotationError):
    """A duplicate, replayed or tampered submission."""
