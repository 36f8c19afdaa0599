"""User prompt templates (issue 25.5): bare ``{name}`` placeholders only. GSM8K's template went to
``str.format``, so ``{question:>1000000}`` made megabyte prompts (a width of 2e9: 2 GB per prompt in
the worker) and ``{question.__class__}`` reached into the object."""

from __future__ import annotations

import re

import pytest

from engine.data.sources import DataError
from engine.registry import tasks
from engine.templates import TemplateError, check_template, render_template


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("Q: {question:>1000000}\nA:", "unknown placeholder {question:>1000000}"),
        ("Q: {question:>2000000000}", "unknown placeholder {question:>2000000000}"),
        ("{question.__class__} {question}", "unknown placeholder {question.__class__}"),
        ("{question!r}", "unknown placeholder {question!r}"),
        ("{question} {0}", "unknown placeholder {0}"),
        ("{question} {", "literal braces"),
    ],
)
def test_gsm8k_refuses_format_specs_conversions_and_lookups(template: str, says: str) -> None:
    with pytest.raises(DataError, match=rf"prompt_template: .*{re.escape(says)}"):
        tasks.build("gsm8k", prompt_template=template)


def test_gsm8k_inserts_the_question_verbatim() -> None:
    task = tasks.build("gsm8k", prompt_template="{{literal}} Q: {question}\nA:")
    sample = task.load("test")[0]
    question = sample.meta["question"]
    assert sample.prompt == "{literal} Q: " + question + "\nA:"
    # A question with braces is data, never a template: it is not formatted again.
    assert render_template("Q: {question}", {"question": "{x:>99} {0}"}) == "Q: {x:>99} {0}"


def test_check_template_names_what_is_missing_or_too_long() -> None:
    assert check_template("a {x} b", ("x", "y"), ("x",)) == "a {x} b"
    with pytest.raises(TemplateError, match=r"must contain \{y\}"):
        check_template("a {x}", ("x", "y"), ("y",))
    with pytest.raises(TemplateError, match="longer than 10 characters"):
        check_template("{x}" + "." * 10, ("x",), max_chars=10)
    with pytest.raises(TemplateError, match="empty"):
        check_template("  ", ("x",))
