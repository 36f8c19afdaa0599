"""Reproduction studies: the RL4LMs paper's IMDB grid at small scale, resumable, with a report.

``python -m engine study grue-imdb --out DIR`` trains every cell of the grid (Zero-shot, Supervised,
PPO, NLPO, Supervised + PPO, Supervised + NLPO) for every seed, each into ``DIR/runs/<cell>-seed<k>/``,
then evaluates each trained model on the same held-out test prompts with the paper's metrics.
``python -m engine study report DIR`` aggregates: the results table (mean ± std over seeds), learning
curves with seed bands (data and SVG images) and the verdicts on the paper's three claims.
``python -m engine study export DIR --out FILE`` writes the compact reference-run file the web app
loads (``manage.py load_reference_runs``): metrics, samples and evaluations, no weights.

One concept per module, imported in this order (no module imports the package itself, so there is no
circle): ``common`` (files, metric keys, the error, seed statistics), ``paper`` (the paper's numbers),
``budgets`` (the one place the grid is sized: ``BUDGETS``), ``runner`` (training and test-evaluating the
grid, resumable), ``reading`` (a study directory's runs and series), ``check`` (the learning check),
``verdicts`` (the paper's claims and the noise rule), ``charts`` (SVG figures), ``report`` (table,
curves, markdown, docs section) and ``reference`` (the reference-run export the web app loads).
This package re-exports their public names so ``from engine.study import X`` keeps working; the web
app imports the modules it needs (``paper``, ``common``, ``reference``) directly.

The package imports no torch: the web app reads reference files through it (tests/engine/test_study.py
checks); the runner imports torch inside the functions that train.
"""

from __future__ import annotations

from engine.study.budgets import (
    BUDGETS,
    STUDIES,
    Budget,
    Study,
    cell_config,
    cost_units,
    get_budget,
    get_study,
    test_config,
)
from engine.study.charts import svg_chart
from engine.study.check import comparison_figures, learning_check
from engine.study.common import (
    PERPLEXITY,
    REFERENCE_FORMAT,
    RESULT_FILE,
    SENTIMENT,
    SENTIMENT_CONTINUATION,
    SENTIMENT_VADER,
    STUDY_FILE,
    TEST_FILE,
    StudyError,
    mean_std,
    run_key,
)
from engine.study.paper import PAPER_IMDB
from engine.study.reading import curve_points, load_study, read_jsonl
from engine.study.reference import export_reference, local_config, portable_config, read_reference
from engine.study.report import (
    CURVES,
    DOC_END,
    DOC_START,
    TABLE_METRICS,
    curves,
    markdown_report,
    results_table,
    run_rows,
    runs_markdown,
    write_report,
)
from engine.study.runner import Job, cpu_model, fmt_seconds, machine_record, run_job, run_state, run_study
from engine.study.verdicts import FLUENCY_TOLERANCE, compare, verdicts

__all__ = [
    "BUDGETS",
    "CURVES",
    "DOC_END",
    "DOC_START",
    "FLUENCY_TOLERANCE",
    "PAPER_IMDB",
    "PERPLEXITY",
    "REFERENCE_FORMAT",
    "RESULT_FILE",
    "SENTIMENT",
    "SENTIMENT_CONTINUATION",
    "SENTIMENT_VADER",
    "STUDIES",
    "STUDY_FILE",
    "TABLE_METRICS",
    "TEST_FILE",
    "Budget",
    "Job",
    "Study",
    "StudyError",
    "cell_config",
    "compare",
    "cost_units",
    "cpu_model",
    "curve_points",
    "curves",
    "export_reference",
    "fmt_seconds",
    "get_budget",
    "get_study",
    "comparison_figures",
    "learning_check",
    "load_study",
    "local_config",
    "machine_record",
    "markdown_report",
    "mean_std",
    "portable_config",
    "read_jsonl",
    "read_reference",
    "results_table",
    "run_rows",
    "runs_markdown",
    "run_job",
    "run_key",
    "run_state",
    "run_study",
    "svg_chart",
    "test_config",
    "verdicts",
    "write_report",
]
