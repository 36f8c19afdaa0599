"""One rank of a worker-launched multi-process run: ``torchrun ... -m webapp.runs.rank_main RUN_ID CONFIG``.

Started by ``webapp/runs/launcher.py`` (read its docstring). Rank 0 trains with the worker's sink and
stop check (``Recorder``, ``StopCheck``) and leaves the engine's summary in the run directory for the
worker; the other ranks train with no sink (rank 0 alone reports, engine/distributed.py).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # before the app modules below, which import Django models

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import engine  # noqa: E402
from webapp.runs.launcher import SUMMARY_FILE, die_with_parent  # noqa: E402
from webapp.runs.recorder import Recorder  # noqa: E402
from webapp.runs.tasks import StopCheck  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # a killed torchrun agent (or worker) takes every rank with it
    p = argparse.ArgumentParser(prog="python -m webapp.runs.rank_main")
    p.add_argument("run_id", type=int)
    p.add_argument("config")
    p.add_argument("--resume", default=None)
    args = p.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    if int(os.environ.get("RANK", "0")) > 0:
        engine.train(config, resume_from=args.resume)
        return 0
    recorder = Recorder(args.run_id)
    try:
        summary = engine.train(
            config, sink=recorder, should_stop=StopCheck(args.run_id), resume_from=args.resume
        )
    finally:
        recorder.close()  # everything stored before the worker reads the summary
    out = Path(config["train"]["output_dir"]) / SUMMARY_FILE
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, default=str))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
