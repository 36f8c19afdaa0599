"""Verifiable rewards for maths word problems (GSM8K format): the final number, parsed and checked.

The reward is exact: 1 when the number the generation commits to equals the gold answer, else 0 (or a
small ``format_reward`` for a wrong answer given in the expected form). That is what makes RL with
verifiable rewards (RLVR) work without a learned reward model — and also what makes the parser the whole
reward, so its rules are written down here and tested on the awkward cases.

Parsing rules (the same spirit as verl's GSM8K scorer and TRL's ``accuracy_reward``, written afresh):

- A *marked* answer wins over every other number, in this order of markers: ``#### 42`` (GSM8K's own
  answer line, verl's "strict" form), ``\\boxed{42}`` (TRL / math-verify's boxed priority), then a phrase
  ``answer is 42`` / ``answer: 42`` / ``final answer = 42``. Of one marker kind, the FIRST occurrence
  counts: a model that keeps writing after its answer line (a new "Question: …" with its own ``####``)
  is judged on the answer it gave, as verl's ``re.search`` and math-verify's ``first_match`` do. A phrase
  that starts a calculation (``Answer: 16 - 3 = 13``) is not a marked answer.
- With no marker, ``mode='flexible'`` takes the LAST number in the text (verl's flexible mode: the
  reasoning comes first, the result last); ``mode='strict'`` finds no answer (only ``####`` counts).
- Numbers: thousands separators (``1,234``, LaTeX ``1{,}234``), a currency sign (``$12.50``, ``\\$5``,
  ``-$3``), a minus sign (ASCII or U+2212), decimals, and a trailing unit or ``%`` (``12 dollars``,
  ``5 km``) are understood; a sentence's full stop is not a decimal point; the ``-`` of ``10-3`` is a
  subtraction, not a negative 3. Inside ``\\boxed{}`` a ``\\frac{a}{b}`` is the fraction a/b.
- Comparison is numeric and exact (fractions, no float tolerance): ``12.50`` equals ``12.5`` and ``18.0``
  equals ``18`` (verl compares the strings and would not; math-verify compares values, as here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from engine.registry import rewards

__all__ = [
    "Extraction",
    "MathAccuracyReward",
    "MathFormatReward",
    "answers_match",
    "extract",
    "extract_answer",
    "format_number",
    "gold_answer",
    "parse_number",
]

Mode = Literal["flexible", "strict"]
MODES = ("flexible", "strict")

# One number: optional minus and currency sign, digits with or without thousands separators, optional
# decimals. The look-behind keeps "x2", "3.5"'s tail and the "-3" of "10-3" from being read as numbers of
# their own; the look-aheads keep "1,2345" from being "1,234" + "5" (it is the list 1, 2345).
_NUMBER = r"(?<![\w.])(?P<neg>[-\u2212]\s?)?\$?\s?(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?(?!\d)"
NUMBER_RE = re.compile(_NUMBER)
HASH_RE = re.compile(r"####\s*\$?\s*(?P<num>[-\u2212]?\s?\$?\s?[\d,]*\d(?:\.\d+)?)")
PHRASE_RE = re.compile(
    r"\banswer\b\s*(?:is|was|would be|will be)?\s*[:=]?\s*(?:\$\s*)?(?P<rest>[-\u2212$\d].*)", re.IGNORECASE
)
OPERATOR_AFTER_RE = re.compile(r"\s*[-+*/\u00d7\u00f7=^\u2212]\s*[\d$(]")
FRAC_RE = re.compile(r"\\d?frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}")
GSM8K_GOLD_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Extraction:
    """The answer a generation commits to: its value (None: no answer) and whether it was marked."""

    value: Fraction | None
    marked: bool = False

    @property
    def text(self) -> str | None:
        return format_number(self.value) if self.value is not None else None


def _clean(text: str) -> str:
    # LaTeX spellings of the same number: 1{,}234, \$5, thin spaces; the Unicode minus stays (handled).
    return text.replace("{,}", ",").replace("\\$", "$").replace("\\!", "").replace("\\,", "")


def _value(match: re.Match[str]) -> Fraction:
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    value = Fraction(digits)
    return -value if match.group("neg") else value


def parse_number(text: str) -> Fraction | None:
    """The first number in ``text`` (with the rules above), or None; ``"$1,234.50 km"`` -> 2469/2."""
    text = _clean(text)
    frac = FRAC_RE.search(text)
    m = NUMBER_RE.search(text)
    if frac and (m is None or frac.start() <= m.start()):
        num, den = int(frac.group(1)), int(frac.group(2))
        return Fraction(num, den) if den else None
    return _value(m) if m else None


def format_number(value: Fraction) -> str:
    """Canonical text of a value: ``1234``, ``-12.5``, or ``1/3`` when it has no finite decimal form."""
    if value.denominator == 1:
        return str(value.numerator)
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value) * 10**places
    whole = str(int(scaled)).rjust(places + 1, "0")
    s = f"{whole[:-places]}.{whole[-places:]}".rstrip("0").rstrip(".")
    return f"-{s}" if value < 0 else s


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (balanced braces), in order."""
    out = []
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def extract(text: str, mode: Mode = "flexible") -> Extraction:
    """The answer a generation gives (see the module docstring for the rules)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    text = _clean(text or "")
    m = HASH_RE.search(text)
    if m:
        value = parse_number(m.group("num"))
        if value is not None:
            return Extraction(value, marked=True)
    if mode == "strict":
        return Extraction(None)
    for content in _boxed_contents(text):
        value = parse_number(content)
        if value is not None:
            return Extraction(value, marked=True)
    for m in PHRASE_RE.finditer(text):
        # "Answer: 16 - 3 = 13" starts a calculation, not an answer: a number followed by an operator is
        # not taken (the last number of the text decides instead).
        num = NUMBER_RE.match(m.group("rest"))
        if num and not OPERATOR_AFTER_RE.match(m.group("rest"), num.end()):
            return Extraction(_value(num), marked=True)
    numbers = list(NUMBER_RE.finditer(text))
    if numbers:
        return Extraction(_value(numbers[-1]), marked=False)
    return Extraction(None)


def extract_answer(text: str, mode: Mode = "flexible") -> str | None:
    """The canonical text of the answer a generation gives (``"1234"``, ``"-12.5"``), or None."""
    return extract(text, mode).text


def answers_match(predicted: str | Fraction | None, gold: str | Fraction | None) -> bool:
    """Exact numeric equality of two answers (texts are parsed with ``parse_number``)."""
    p = parse_number(predicted) if isinstance(predicted, str) else predicted
    g = parse_number(gold) if isinstance(gold, str) else gold
    return p is not None and g is not None and p == g


def gold_answer(references: list[str], meta: dict[str, Any], index: int = 0) -> Fraction:
    """The gold value of a sample: ``meta['answer']`` (the GSM8K task sets it), else the ``####`` line of
    the first reference, else the reference's first number; a sample with none is an error naming it."""
    candidates: list[str] = []
    if meta.get("answer") not in (None, ""):
        candidates.append(str(meta["answer"]))
    for ref in references[:1]:
        m = GSM8K_GOLD_RE.search(ref)
        candidates.append(m.group(1) if m else ref)
    for c in candidates:
        value = parse_number(c)
        if value is not None:
            return value
    raise ValueError(
        f"sample {index}: no gold answer (meta 'answer' or a number in the first reference, "
        f"e.g. '#### 42'); got meta answer {meta.get('answer')!r}, references {references[:1]!r}"
    )


class MathAccuracyReward:
    """Exact match of the final number with the gold answer (GSM8K ``#### n``, ``\\boxed{n}``, last number).

    ``correct_reward`` for a right answer; ``format_reward`` for a wrong answer given in the expected
    form (a marked answer; in ``strict`` mode the ``####`` line), as verl's ``format_score``; 0 for no
    answer or an unmarked wrong one.
    """

    def __init__(self, mode: Mode = "flexible", correct_reward: float = 1.0, format_reward: float = 0.0):
        if mode not in MODES:
            raise ValueError(f"math_accuracy: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.correct_reward = float(correct_reward)
        self.format_reward = float(format_reward)

    def judge(self, generations: list[str], references: list[list[str]], meta: list[dict[str, Any]]):
        """(extraction, gold, correct) per sample."""
        out = []
        for i, (gen, refs, m) in enumerate(zip(generations, references, meta)):
            ex = extract(gen, self.mode)
            gold = gold_answer(list(refs), dict(m or {}), i)
            out.append((ex, gold, ex.value is not None and ex.value == gold))
        return out

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        return [
            self.correct_reward if ok else (self.format_reward if ex.marked else 0.0)
            for ex, _gold, ok in self.judge(generations, references, meta)
        ]

    def sample_details(self, prompts, generations, references, meta) -> list[dict[str, float | None]]:
        """Per-sample numbers for the run page's samples table: what was read, the gold, and the verdict."""
        return [
            {
                "extracted": float(ex.value) if ex.value is not None else None,
                "gold": float(gold),
                "correct": 1.0 if ok else 0.0,
            }
            for ex, gold, ok in self.judge(generations, references, meta)
        ]


class MathFormatReward:
    """1 when the generation gives a marked answer (``#### n``; in ``flexible`` mode also ``\\boxed{n}`` or
    "the answer is n"), else 0: a shaping term to add to ``math_accuracy`` with ``weighted_sum``."""

    def __init__(self, mode: Mode = "flexible"):
        if mode not in MODES:
            raise ValueError(f"math_format: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        return [1.0 if extract(g, self.mode).marked else 0.0 for g in generations]


rewards.add(
    "math_accuracy",
    MathAccuracyReward,
    "Maths answer exact match (GSM8K '#### n', \\boxed{n}, last number); optional format reward",
)
rewards.add(
    "math_format", MathFormatReward, "1 when the generation gives a marked answer (#### n, \\boxed{n})"
)
