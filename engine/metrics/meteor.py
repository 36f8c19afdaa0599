"""METEOR (Banerjee and Lavie 2005) through NLTK, with WordNet read from Debian's packaged files.

NLTK normally downloads WordNet; here nothing can be downloaded, so the Debian WordNet 3.0 files are
copied (NLTK rejects symlinks leaving its data root) together with the ``lexnames`` file Debian
omits (shipped in ``assets/``) into ``$GRUE_CACHE/nltk_data/corpora/wordnet``.
"""

from __future__ import annotations

import re
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any

from engine.metrics.base import Metric, MetricError, MetricResult, cache_dir, check_inputs, mean
from engine.registry import metrics

WORDNET_SOURCE = Path("/usr/share/wordnet")
LEXNAMES = Path(__file__).parent / "assets" / "lexnames"
_REQUIRED = ("data.noun", "index.noun", "index.sense", "noun.exc", "data.verb", "index.verb")
_INSTALL_HINT = (
    "METEOR needs WordNet 3.0: run `make system-packages` (or `apt-get install wordnet-base "
    "wordnet-sense-index`; files go to /usr/share/wordnet), or pass wordnet_dir=<folder with data.noun, "
    "index.sense, ...>"
)
_lock = threading.Lock()


def ensure_wordnet(source: str | Path | None = None, nltk_dir: str | Path | None = None) -> Path:
    """Build (once) an NLTK data dir holding WordNet and put it first on ``nltk.data.path``."""
    import nltk

    src = Path(source) if source else WORDNET_SOURCE
    missing = [f for f in _REQUIRED if not (src / f).is_file()]
    root = Path(nltk_dir) if nltk_dir else cache_dir() / "nltk_data"
    target = root / "corpora" / "wordnet"
    with _lock:
        if not (target / "lexnames").is_file() or any(not (target / f).is_file() for f in _REQUIRED):
            if missing:
                raise MetricError(f"WordNet files {missing} not found in {src}. {_INSTALL_HINT}")
            tmp = target.with_name("wordnet.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for f in src.iterdir():
                if f.is_file():
                    shutil.copyfile(f, tmp / f.name)
            shutil.copyfile(LEXNAMES, tmp / "lexnames")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        if str(root) not in nltk.data.path:
            nltk.data.path.insert(0, str(root))
    return root


_wordnet: Any = None


def wordnet() -> Any:
    """A loaded WordNet reader (NLTK's lazy loader would otherwise try to download on failure)."""
    global _wordnet
    if _wordnet is None:
        root = ensure_wordnet()

        from nltk.corpus.reader.wordnet import WordNetCorpusReader

        with warnings.catch_warnings():  # "multilingual functions are not available": we need none
            warnings.simplefilter("ignore", UserWarning)
            _wordnet = WordNetCorpusReader(str(root / "corpora" / "wordnet"), None)
    return _wordnet


_ABBREV = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "jr",
    "sr",
    "prof",
    "vs",
    "etc",
    "inc",
    "ltd",
    "co",
    "no",
    "mt",
    "ft",
}
_SENT_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")
_word_tokenizer: Any = None


def split_sentences(text: str) -> list[str]:
    """Sentence split for tokenisation: at . ! ? followed by an upper-case or digit start.

    ``word_tokenize`` uses punkt's trained English model here (a download); without it, periods inside
    a text would stay glued to words ("left." instead of "left", "."). Titles (Mr., Dr., ...) and single
    initials (J. Smith, U.S.) do not end a sentence.
    """
    parts: list[str] = []
    start = 0
    for m in _SENT_END.finditer(text):
        before = text[start : m.start()].rstrip("\"')]")
        last = before.rsplit(None, 1)[-1] if before.split() else ""
        word = last.rstrip(".").lower()
        if last.endswith(".") and (word in _ABBREV or len(word.replace(".", "")) <= 1):
            continue
        parts.append(text[start : m.start() + len(m.group(1))])
        start = m.end()
    parts.append(text[start:])
    return [p for p in (x.strip() for x in parts) if p]


def tokenize(text: str) -> list[str]:
    """Treebank-style word tokens like ``nltk.word_tokenize``, without its punkt download."""
    global _word_tokenizer
    if _word_tokenizer is None:
        from nltk.tokenize import NLTKWordTokenizer

        _word_tokenizer = NLTKWordTokenizer()
    return [t for sent in split_sentences(text) for t in _word_tokenizer.tokenize(sent)]


@metrics.register("meteor", "METEOR (NLTK, WordNet synonyms, Porter stems); max over references")
class Meteor(Metric):
    """NLTK's ``meteor_score`` per sample (best reference); corpus = mean, as HF ``evaluate`` does."""

    reward_key = "lexical/meteor"

    def __init__(self, alpha: float = 0.9, beta: float = 3.0, gamma: float = 0.5):
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        self._wn = wordnet()

    def score(self, generation: str, refs: list[str]) -> float:
        from nltk.translate.meteor_score import meteor_score

        return float(
            meteor_score(
                [tokenize(r) for r in refs],
                tokenize(generation),
                alpha=self.alpha,
                beta=self.beta,
                gamma=self.gamma,
                wordnet=self._wn,
            )
        )

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        per = [self.score(g, r) for g, r in zip(generations, references)]
        return {"lexical/meteor": (per, mean(per))}
