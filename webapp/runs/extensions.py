"""Extension point of the runs app: other apps plug into the launch form and the run page here.

The runs app imports nothing from the apps that extend it. An app registers its contributions in its
``AppConfig.ready()`` (the way ``engine.registry`` lets components register by id), so removing that
app from ``INSTALLED_APPS`` removes its contributions, and a broken app fails loudly at start-up
instead of being silently skipped by an ``except ImportError``.

Two kinds of contribution:

- **reward choices**: extra rewards offered by the launch form (e.g. reward models trained from human
  judgments). A provider is called each time the form is built, so choices stay current; each choice
  is ``{"id": str, "label": str, "config": dict}`` where ``config`` is the whole ``reward`` section
  the run config gets when the choice is selected.
- **run panels**: blocks of HTML on a run's page (e.g. its human-evaluation results). A panel returns
  HTML that it rendered and escaped itself (a template), or None to show nothing for that run.
- **launch sources**: a query parameter of the launch form (e.g. ``?dpo_campaign=<id>``) whose value a
  source turns into the whole initial config, built on the server (the client sends only the id). A
  source raises ``ValueError`` with a message for the user when it cannot (unknown id, no data).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest

if TYPE_CHECKING:  # the models module imports Django's app registry; only the type is needed here
    from webapp.runs.models import Run

RewardChoiceProvider = Callable[[], list[dict[str, Any]]]
RunPanel = Callable[[HttpRequest, "Run"], "str | None"]

_reward_providers: list[RewardChoiceProvider] = []
_run_panels: dict[str, tuple[int, RunPanel]] = {}
LaunchSource = Callable[[HttpRequest, str], dict[str, Any]]
_launch_sources: dict[str, LaunchSource] = {}


def register_reward_choices(provider: RewardChoiceProvider) -> None:
    """Add a provider of launch-form reward choices. Registering the same provider again is a no-op
    (``ready()`` may run more than once in tests)."""
    if provider not in _reward_providers:
        _reward_providers.append(provider)


def reward_choices() -> list[dict[str, Any]]:
    """Every provider's choices, concatenated in registration order.

    A malformed choice is a programming error of the providing app: it raises with the provider's
    name instead of being dropped, so the launch form never silently loses a reward."""
    out: list[dict[str, Any]] = []
    for provider in _reward_providers:
        for choice in provider():
            if (
                not isinstance(choice, dict)
                or not isinstance(choice.get("id"), str)
                or not isinstance(choice.get("label"), str)
                or not isinstance(choice.get("config"), dict)
            ):
                name = getattr(provider, "__qualname__", repr(provider))
                raise TypeError(
                    f"reward choice provider {name} returned {choice!r}; expected "
                    '{"id": str, "label": str, "config": dict}'
                )
            out.append(choice)
    return out


def register_run_panel(name: str, panel: RunPanel, order: int = 100) -> None:
    """Add (or replace, by ``name``) a panel of the run page; lower ``order`` shows first."""
    _run_panels[name] = (order, panel)


def run_panels(request: HttpRequest, run: Run) -> list[tuple[str, str]]:
    """``(name, html)`` of every panel that has something to show for ``run``, in order."""
    out: list[tuple[str, str]] = []
    for name, (_order, panel) in sorted(_run_panels.items(), key=lambda item: (item[1][0], item[0])):
        html = panel(request, run)
        if html is not None:
            out.append((name, html))
    return out


def register_launch_source(param: str, source: LaunchSource) -> None:
    """Let ``?<param>=<value>`` on the launch form prefill it with ``source(request, value)``."""
    _launch_sources[param] = source


def launch_source(request: HttpRequest) -> tuple[LaunchSource, str] | None:
    """The registered source named by the request's query string, with its value (first match)."""
    for param, source in _launch_sources.items():
        value = request.GET.get(param, "")
        if value:
            return source, value
    return None


# A gold of the over-optimisation watch that another app computes (webapp/runs/overopt_views.py):
# e.g. the Bradley–Terry ratings of a human campaign over the run's checkpoints. A source returns, for
# a run, ``[{"key": str, "label": str, "series": {step: value}, "note": str}]``: the panel offers each
# key in its gold menu and draws the series like a logged gold.
GoldSource = Callable[["Run"], list[dict[str, Any]]]
_gold_sources: dict[str, GoldSource] = {}


def register_gold_source(name: str, source: GoldSource) -> None:
    """Add (or replace, by ``name``) a provider of golds for the over-optimisation panel."""
    _gold_sources[name] = source


def gold_sources(run: Run) -> list[dict[str, Any]]:
    """Every source's golds for ``run``; a malformed one raises with the source's name."""
    out: list[dict[str, Any]] = []
    for name, source in sorted(_gold_sources.items()):
        for gold in source(run):
            if (
                not isinstance(gold, dict)
                or not isinstance(gold.get("key"), str)
                or not isinstance(gold.get("label"), str)
                or not isinstance(gold.get("series"), dict)
            ):
                raise TypeError(f"gold source {name} returned {gold!r}; expected key, label, series")
            out.append({"note": "", **gold})
    return out
