"""``{% load grue_watch %}``: the rubric and over-optimisation panels (``webapp/runs/overopt_views.py``)."""

from __future__ import annotations

from webapp.runs.overopt_views import register

__all__ = ["register"]
