"""The RL4LMs paper's published numbers, as data: the study's report prints them beside its own
table and the web app's GRUE page shows them as the paper's row.

A module of its own: these numbers are data that both sides read, apart from the code that computes
the study's own, so a correction to the paper's table is one edit in one place."""

from __future__ import annotations

# RL4LMs paper, IMDB test set, GPT-2 (sentiment, perplexity); the GRUE page's paper row reads it from here.
PAPER_IMDB = {
    "zero_shot": (0.489, 32.17),
    "supervised": (0.539, 35.47),
    "ppo": (0.602, 33.82),
    "nlpo": (0.611, 33.83),
    "supervised_ppo": (0.626, 35.05),
    "supervised_nlpo": (0.620, 34.82),
}
