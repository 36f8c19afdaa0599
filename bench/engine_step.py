"""Benchmark one PPO iteration of the engine, split into generate / score / update, with peak memory.

Not a test. Compares:
  * engine   : the engine's own iteration (Trainer.rl_iteration: rollout with KV cache, one scoring pass,
               reward, KL shaping, GAE, PPO epochs), shared value head, bf16 autocast, fp32 master weights;
  * raw      : the same work written by hand with plain HF calls (``generate``, one scoring forward per
               model, the same forward/backward passes), same precision -> overhead = engine / raw;
  * separate : the engine with a separate full critic model in fp32 (the design of the best-known peer).

GRPO (``--grpo``): the reference workload of the group-algorithm issue: SmolLM2-135M, 4 IMDB prompts x 4
completions x 48 tokens (EOS suppressed), one optimizer step per iteration, beta 0.04 and beta 0 (then
no reference model exists at all); generation, scoring, update and the whole iteration are timed, in
wall seconds and in CPU seconds of the process (less sensitive to other people's load).

Usage:
  python bench/engine_step.py                      # tiny GPT-2 and SmolLM2-135M
  python bench/engine_step.py --grpo --threads 2   # GRPO step on SmolLM2, beta 0.04 and 0 (3 repeats)
  python bench/engine_step.py --ppo-imdb --threads 2   # issue #9's PPO reference workload (2 repeats)
  python bench/engine_step.py --models tiny        # only the tiny model
  python bench/engine_step.py --json out.json      # also write the numbers
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import parse_config  # noqa: E402
from engine.events import MultiSink, NullSink  # noqa: E402


class PeakMemory:
    """Peak resident memory (CPU, sampled every ``interval_s``) or peak CUDA allocation during a block.

    The sampler thread's own CPU time counts in ``time.process_time``: at 5 ms on a loaded machine it
    was ~10 % of a GRPO step's CPU seconds, so the GRPO benchmark samples every 50 ms.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.005):
        self.device = device
        self.interval_s = interval_s
        self.peak_mb = 0.0

    @staticmethod
    def _rss_mb() -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        self._stop = False
        self.peak_mb = self._rss_mb()

        def sample() -> None:
            while not self._stop:
                self.peak_mb = max(self.peak_mb, self._rss_mb())
                time.sleep(self.interval_s)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20
            return
        self._stop = True
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self._rss_mb())


def git_commit() -> str:
    """The checked-out commit (and '+dirty' with uncommitted changes), for the results table."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "engine", "bench"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def smollm2_path() -> str:
    from engine.assets import smollm2_gguf_path

    return str(smollm2_gguf_path())


def make_config(model: str, value_head: str, precision: str, device: str, args: argparse.Namespace) -> dict:
    return {
        "name": "bench",
        "model": {
            "name_or_path": model,
            "value_head": value_head,
            "mixed_precision": precision,
            "device": device,
        },
        "task": {
            "id": "synthetic_increasing_numbers",
            "args": {"n_samples": 64, "prompt": "Count upwards: 1 2 3"},
        },
        "reward": {"id": "increasing_numbers", "args": {"min_tokens": 20}},
        "rollout": {
            "max_new_tokens": args.new_tokens,
            "min_new_tokens": args.new_tokens,
            "batch_size": args.prompts,
        },
        "algorithm": {"id": "ppo", "n_epochs": args.epochs, "minibatch_size": args.minibatch},
        "kl": {"controller": "adaptive"},
        "train": {"n_iters": 1, "prompts_per_iter": args.prompts, "eval_every": 0, "save_every": 0},
    }


class CpuClock:
    """CPU seconds (``time.process_time``: every thread of the process) spent inside wrapped functions.

    Wall time on a shared machine measures the load as much as the code; CPU time is what the code
    asked for. With 2 threads it can reach 2x the wall time of a phase.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, phase: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.process_time() - t0

        return timed


def engine_setup(cfg_dict: dict, mem_interval_s: float = 0.005, prompts: list[str] | None = None) -> Any:
    """A callable running Trainer.rl_iteration (the exact code path of engine.train); ``prompts``:
    every iteration uses exactly these prompts (a fixed workload) instead of the task's stream."""
    import engine.rollout as rollout
    from engine.kl import build_kl_controller
    from engine.sinks import RunDirSink
    from engine.trainer import Trainer, build_reward_fn

    cfg = parse_config(cfg_dict)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    sink = RunDirSink(run_dir)
    t = Trainer(cfg, MultiSink(sink, NullSink()), run_dir, sink)
    t.reward_fn = build_reward_fn(cfg)
    t._setup_reference()  # the initial policy's copy; none for GRPO & co. at beta 0
    t.kl_ctl = build_kl_controller(cfg.kl)
    t.optimizer = t._make_rl_optimizer()
    t.algo.setup(t.policy)
    if prompts is not None:
        from engine.data.base import Sample

        fixed = [Sample(id=str(i), prompt=p, references=[""]) for i, p in enumerate(prompts)]
        t._prompts_for = lambda iteration: list(fixed)
    n_params = sum(p.numel() for p in t.policy.parameters())
    clock = CpuClock()  # collect() looks these up in its module at call time, so the wrappers are used
    rollout.generate = clock.wrap("generate", rollout.generate)
    rollout.score = clock.wrap("score", rollout.score)
    rollout.reference_logprobs = clock.wrap("score", rollout.reference_logprobs)
    t.algo.update = clock.wrap("update", t.algo.update)
    t.reward_fn = clock.wrap("reward", t.reward_fn)

    def one(epochs: int | None = None) -> dict[str, Any]:
        full = t.algo.cfg.n_epochs
        t.algo.cfg.n_epochs = epochs or full
        clock.seconds.clear()
        cpu0 = time.process_time()
        with PeakMemory(t.device, mem_interval_s) as mem:
            m = t.rl_iteration()
        cpu = time.process_time() - cpu0
        t.algo.cfg.n_epochs = full
        return {
            "generate_s": m["time/generate_s"],
            "score_s": m["time/score_s"],
            "update_s": m["time/update_s"],
            "iteration_s": m["time/iteration_s"],
            "cpu_generate_s": clock.seconds.get("generate", 0.0),
            "cpu_score_s": clock.seconds.get("score", 0.0),
            "cpu_update_s": clock.seconds.get("update", 0.0),
            "cpu_iteration_s": cpu,
            "load_average_1m": os.getloadavg()[0],
            "peak_mem_mb": mem.peak_mb,
            "episode_length": m["train/episode_length"],
            "n_params": n_params,
        }

    one.trainer = t  # type: ignore[attr-defined]  # for --profile: the update is wrapped in a profiler
    return one


def grpo_config(model: str, beta: float, device: str) -> dict:
    """4 IMDB prompts (shipped fixture) x G = 4 completions x exactly 48 tokens, one optimizer step."""
    return {
        "name": "bench-grpo",
        "model": {"name_or_path": model, "mixed_precision": "auto", "device": device},
        "tokenizer": {"padding_side": "left", "pad_token_as_eos_token": True, "max_prompt_length": 64},
        "task": {"id": "imdb", "seed": 42},
        "reward": {"id": "sentiment_vader", "include_prompt": False},
        "rollout": {"max_new_tokens": 48, "min_new_tokens": 48, "batch_size": 16},
        "algorithm": {
            "id": "grpo",
            "learning_rate": 1e-6,
            "n_epochs": 1,
            "minibatch_size": 16,
            "group": {"group_size": 4, "beta": beta},
        },
        "train": {"n_iters": 1, "prompts_per_iter": 4, "eval_every": 0, "save_every": 0, "log_samples": 0},
    }


IMDB_REFERENCE = Path(__file__).resolve().parent / "fixtures" / "imdb_ppo_reference.jsonl"


def imdb_reference_prompts(
    n: int = 16, lo: int = 51, hi: int = 63, source: Path = IMDB_REFERENCE
) -> list[str]:
    """Issue #9's reference workload: the first ``n`` reviews of the IMDB train set (file order) whose
    prompt — the first half of the words, RL4LMs's IMDB prompt — is ``lo``–``hi`` GPT-2 tokens. The
    16 are shipped in ``bench/fixtures/`` (selected from the full train set by this same rule; see
    PROVENANCE.md there); ``source`` may name the full train set's JSONL instead."""
    from engine.data.imdb import split_words
    from engine.jsonl import read_jsonl
    from engine.models.builtin import builtin_model_dir
    from engine.models.loading import load_tokenizer

    gpt2 = load_tokenizer(str(builtin_model_dir("builtin:tiny-gpt2")))  # the real GPT-2 tokenizer
    out = []
    for row in read_jsonl(source):
        prompt = split_words(row["text"])[0]
        if lo <= len(gpt2(prompt)["input_ids"]) <= hi:
            out.append(prompt)
            if len(out) == n:
                return out
    raise RuntimeError(f"{source} has only {len(out)} prompts of {lo}-{hi} GPT-2 tokens")


def ppo_imdb_config(
    model: str, device: str, value_head: str = "shared", mixed_precision: str = "auto", top_k: int = 0
) -> dict:
    """Issue #9's reference workload: 16 prompts x exactly 48 sampled tokens (EOS suppressed),
    temperature 1, no top-k/top-p, VADER on the continuation, fixed KL coefficient 0.05, PPO 4 epochs x
    minibatch 4 (16 optimizer steps), SmolLM2-135M-Instruct; the shared value head by default, or a
    separate critic (issue #30: TRL's and RL4LMs's design)."""
    return {
        "name": "bench-ppo-imdb",
        "model": {
            "name_or_path": model,
            "mixed_precision": mixed_precision,
            "device": device,
            "value_head": value_head,
        },
        "tokenizer": {"padding_side": "left", "pad_token_as_eos_token": True, "max_prompt_length": 128},
        "task": {"id": "imdb", "seed": 42},
        "reward": {"id": "sentiment_vader", "include_prompt": False},
        "rollout": {"max_new_tokens": 48, "min_new_tokens": 48, "batch_size": 16, "top_k": top_k},
        "kl": {"controller": "fixed", "init_coef": 0.05},
        "algorithm": {"id": "ppo", "n_epochs": 4, "minibatch_size": 4},
        "train": {"n_iters": 1, "prompts_per_iter": 16, "eval_every": 0, "save_every": 0, "log_samples": 0},
    }


def ppo_imdb_main(args: argparse.Namespace) -> dict[str, Any]:
    """One warm-up iteration (one epoch), then ``repeats`` timed iterations of the reference workload.

    ``--value-head`` and ``--precision`` choose the design and precision; ``--profile`` instead runs
    one iteration whose update (one epoch: 4 minibatches) is recorded by ``torch.profiler`` and
    prints the ops by self CPU time. The peak RSS reported is the process's high-water mark
    (``ru_maxrss``, as ``bench/peer_trl_ppo.py`` reports TRL's) beside the per-iteration sample."""
    import resource

    prompts = imdb_reference_prompts()
    model = args.model or smollm2_path()
    cfg = ppo_imdb_config(model, args.device, args.value_head, args.precision, args.top_k)
    cfg["resources"] = {"retain_freed_memory": not args.default_malloc}
    cfg["model"]["compile"] = args.compile  # model.compile: the warm-up pays the one-time compile
    cfg["algorithm"]["clip_grad_per_model"] = args.clip_per_model
    cfg["model"]["gradient_checkpointing"] = args.gradient_checkpointing
    cfg["model"]["offload_reference"] = args.offload_reference
    run = engine_setup(cfg, 0.05, prompts=prompts)
    warm = run(epochs=1)
    print("ppo-imdb warm-up", warm, flush=True)
    if args.warmup_only:  # a memory figure: the high-water mark does not depend on the machine's load
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {**warm, "process_peak_rss_mb": peak, "value_head": args.value_head,
                "precision": args.precision, "clip_per_model": args.clip_per_model,
                "gradient_checkpointing": args.gradient_checkpointing,
                "offload_reference": args.offload_reference}  # fmt: skip
    if args.profile:
        return {"profile": profile_update(run, args.profile)}
    rows = []
    for _ in range(args.repeats or 2):
        rows.append(run())
        rows[-1]["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("ppo-imdb", rows[-1], flush=True)
    best = min(rows, key=lambda r: r["iteration_s"])
    return {
        **best,
        "value_head": args.value_head,
        "precision": args.precision,
        "compile": args.compile,
        "clip_per_model": args.clip_per_model,
        "gradient_checkpointing": args.gradient_checkpointing,
        "offload_reference": args.offload_reference,
        "warmup_iteration_s": round(warm["iteration_s"], 2),
        "top_k": args.top_k,
        "default_malloc": args.default_malloc,
        "all_iteration_s": [round(r["iteration_s"], 2) for r in rows],
    }


def profile_update(run: Any, out_path: str) -> str:
    """One iteration with its update (one epoch) under ``torch.profiler``; the ops table by self CPU
    time is written to ``out_path`` and returned. Why: the per-op split of a minibatch shows where the
    update's time goes (matmuls vs. the vocabulary-sized head vs. the optimizer)."""
    from torch.profiler import ProfilerActivity, profile

    algo = run.trainer.algo
    update = algo.update
    tables: list[str] = []

    def profiled(*a: Any, **k: Any) -> Any:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            out = update(*a, **k)
        tables.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        # by input shape too: a (V, H) fill or add is a vocabulary-sized gradient temporary
        by_shape = prof.key_averages(group_by_input_shape=True)
        tables.append(by_shape.table(sort_by="self_cpu_time_total", row_limit=40))
        return out

    algo.update = profiled
    try:
        print("profiled iteration", run(epochs=1), flush=True)
    finally:
        algo.update = update
    Path(out_path).write_text("\n".join(tables))
    print(tables[0], flush=True)
    return out_path


def grpo_main(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up iteration, then ``repeats`` timed GRPO iterations per beta (best shown, all kept).

    Each beta gets its own trainer (beta 0 has no reference model at all); the timed iterations of the
    two alternate, so that load drift on a shared machine hits both alike.
    """
    betas = [float(b) for b in args.betas.split(",")]
    model = args.model or smollm2_path()
    cfgs = {beta: grpo_config(model, beta, args.device) for beta in betas}
    for cfg in cfgs.values():  # --default-malloc: glibc's allocator as it comes (engine/models/memory.py)
        cfg["resources"] = {"retain_freed_memory": not args.default_malloc}
    runs = {beta: engine_setup(cfg, 0.05) for beta, cfg in cfgs.items()}
    for beta, run in runs.items():  # warm-up: every shape seen once (oneDNN primitives, allocator)
        print("grpo beta", beta, "warm-up", run(), flush=True)
    times: dict[float, list[dict[str, Any]]] = {beta: [] for beta in betas}
    for _ in range(args.repeats or 3):
        for beta, run in runs.items():
            times[beta].append(run())
            print("grpo beta", beta, times[beta][-1], flush=True)
    out: dict[str, Any] = {}
    for beta, rows in times.items():
        best = min(rows, key=lambda r: r["iteration_s"])
        out[f"beta={beta}"] = {
            **best,
            "all_iteration_s": [round(r["iteration_s"], 2) for r in rows],
            "all_cpu_iteration_s": [round(r["cpu_iteration_s"], 2) for r in rows],
            "median_iteration_s": sorted(r["iteration_s"] for r in rows)[len(rows) // 2],
        }
    return out


def raw_setup(cfg_dict: dict) -> Any:
    """A callable running the same PPO iteration written by hand with plain HF calls (no engine code)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.loading import autocast_dtype, resolve_device, resolve_model_path

    cfg = parse_config(cfg_dict)
    device = resolve_device(cfg.model.device)
    amp = autocast_dtype(cfg.model.mixed_precision, device)
    path = resolve_model_path(cfg.model.name_or_path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    hidden = model.get_output_embeddings().in_features
    vhead = torch.nn.Linear(hidden, 1).to(device)
    params = list(model.parameters()) + list(vhead.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.algorithm.learning_rate)
    n, new = cfg.train.prompts_per_iter, cfg.rollout.max_new_tokens
    prompts = [f"Count upwards: 1 2 3 {i}" for i in range(n)]

    def ac() -> Any:
        return torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None)

    def one(epochs: int | None = None) -> dict[str, Any]:
        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            enc = tok(prompts, return_tensors="pt", padding=True).to(device)
            p_len = enc["input_ids"].shape[1]
            with torch.no_grad(), ac():
                seq = model.generate(
                    **enc,
                    do_sample=True,
                    top_k=0,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    pad_token_id=tok.pad_token_id,
                )
            t1 = time.perf_counter()
            mask = torch.cat([enc["attention_mask"], torch.ones_like(seq[:, p_len:])], 1)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            gen = seq[:, p_len:]
            with torch.no_grad(), ac():
                out = model(input_ids=seq, attention_mask=mask, position_ids=pos, output_hidden_states=True)
                old_lp = torch.log_softmax(out.logits[:, p_len - 1 : -1].float(), -1).gather(
                    -1, gen[..., None]
                )[..., 0]
                old_v = vhead(out.hidden_states[-1][:, p_len - 1 : -1]).float()[..., 0]
                r_out = ref(input_ids=seq, attention_mask=mask, position_ids=pos)
                ref_lp = torch.log_softmax(r_out.logits[:, p_len - 1 : -1].float(), -1).gather(
                    -1, gen[..., None]
                )[..., 0]
            t2 = time.perf_counter()
            rewards = -0.1 * (old_lp - ref_lp)
            rewards[:, -1] += torch.rand(n, device=device)
            adv = torch.zeros_like(rewards)
            last = torch.zeros(n, device=device)
            for t in reversed(range(new)):
                nv = old_v[:, t + 1] if t + 1 < new else torch.zeros(n, device=device)
                last = rewards[:, t] + 0.99 * nv - old_v[:, t] + 0.99 * 0.95 * last
                adv[:, t] = last
            ret = adv + old_v
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            mb = cfg.algorithm.minibatch_size
            for _epoch in range(epochs or cfg.algorithm.n_epochs):
                perm = torch.randperm(n)
                for i in range(0, n, mb):
                    idx = perm[i : i + mb].to(device)
                    with ac():
                        o = model(
                            input_ids=seq[idx],
                            attention_mask=mask[idx],
                            position_ids=pos[idx],
                            output_hidden_states=True,
                        )
                        v = vhead(o.hidden_states[-1][:, p_len - 1 : -1]).float()[..., 0]
                    lp_all = torch.log_softmax(o.logits[:, p_len - 1 : -1].float(), -1)
                    lp = lp_all.gather(-1, gen[idx][..., None])[..., 0]
                    with torch.no_grad():  # entropy as a statistic (ent_coef = 0), as the engine does
                        ent = -(lp_all.exp() * lp_all.masked_fill(lp_all == float("-inf"), 0)).sum(-1).mean()
                    ratio = torch.exp(lp - old_lp[idx])
                    pg = torch.max(-adv[idx] * ratio, -adv[idx] * ratio.clamp(0.8, 1.2)).mean()
                    vc = old_v[idx] + (v - old_v[idx]).clamp(-0.2, 0.2)
                    vl = 0.5 * torch.max((v - ret[idx]) ** 2, (vc - ret[idx]) ** 2).mean()
                    loss = pg + 0.5 * vl
                    float(ent)
                    opt.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 0.5)
                    opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t3 = time.perf_counter()
        return {
            "generate_s": t1 - t0,
            "score_s": t2 - t1,
            "update_s": t3 - t2,
            "iteration_s": t3 - t0,
            "peak_mem_mb": mem.peak_mb,
        }

    return one


def _single_workload_report(args: argparse.Namespace, workload: str, run: Any) -> None:
    """Run one issue's workload (``--grpo``, ``--ppo-imdb``); print and optionally save the report."""
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}",
        "commit": git_commit(),
        "load_average_before": os.getloadavg(),
        "workload": workload,
        "results": run(args),
        "load_average_after": os.getloadavg(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=0, help="timed repeats (default: 2 tiny, 1 smollm2)")
    ap.add_argument("--skip-separate", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--grpo", action="store_true", help="only the GRPO step (SmolLM2, beta 0.04 and 0)")
    ap.add_argument(
        "--ppo-imdb", action="store_true", help="only issue #9's PPO reference workload (SmolLM2, IMDB)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--value-head", choices=["shared", "separate"], default="shared", help="--ppo-imdb")
    ap.add_argument("--precision", choices=["auto", "no", "bf16"], default="auto", help="--ppo-imdb")
    ap.add_argument("--top-k", type=int, default=0, help="--ppo-imdb: rollout top-k (the study's is 50)")
    ap.add_argument(
        "--clip-per-model",
        action="store_true",
        help="--ppo-imdb: algorithm.clip_grad_per_model (separate critic: one model's gradients at a time)",
    )
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="--ppo-imdb: model.gradient_checkpointing (recompute the trunks' activations in backward)",
    )
    ap.add_argument(
        "--offload-reference",
        action="store_true",
        help="--ppo-imdb: model.offload_reference (the reference in a file between its uses)",
    )
    ap.add_argument(
        "--warmup-only",
        action="store_true",
        help="--ppo-imdb: stop after the warm-up iteration (its peak RSS; no timing)",
    )
    ap.add_argument(
        "--compile", action="store_true", help="--ppo-imdb: model.compile (blocks compiled for the update)"
    )
    ap.add_argument("--profile", default="", help="--ppo-imdb: write a profile of one update epoch here")
    ap.add_argument("--betas", default="0.04,0.0", help="GRPO KL coefficients to time (comma-separated)")
    ap.add_argument(
        "--model", default="", help="--ppo-imdb, --grpo: a model folder instead of the SmolLM2 wheel's GGUF"
    )
    ap.add_argument(
        "--default-malloc",
        action="store_true",
        help="GRPO, --ppo-imdb: resources.retain_freed_memory false (glibc returns big blocks to the kernel)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ppo_imdb:
        return _single_workload_report(
            args,
            "PPO, SmolLM2-135M, 16 IMDB prompts of 51-63 GPT-2 tokens x 48 tokens, VADER, fixed KL 0.05, "
            "4 epochs x minibatch 4",
            ppo_imdb_main,
        )
    if args.grpo:
        return _single_workload_report(
            args,
            "GRPO, SmolLM2-135M, 4 IMDB prompts x 4 completions x 48 tokens, one optimizer step",
            grpo_main,
        )
    models = {"tiny": "builtin:tiny-gpt2", "smollm2": smollm2_path()}
    report: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}",
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "workload": f"{args.prompts} prompts x {args.new_tokens} new tokens, {args.epochs} epochs, minibatch {args.minibatch}",
        "results": {},
    }
    for key in args.models.split(","):
        model = models[key]
        reps = args.repeats or (2 if key == "tiny" else 1)
        res: dict[str, Any] = {}
        run_engine = engine_setup(make_config(model, "shared", "auto", args.device, args))
        run_raw = raw_setup(make_config(model, "shared", "auto", args.device, args))
        # Warm-up with one epoch: every shape is seen once (oneDNN primitives, allocator), so the
        # timed iterations measure the steady state of both implementations.
        run_engine(epochs=1)
        run_raw(epochs=1)
        eng, raw = [], []
        for _ in range(reps):  # interleaved, so that load drift on a shared machine hits both alike
            eng.append(run_engine())
            raw.append(run_raw())
            print(key, "engine", eng[-1], "raw", raw[-1], flush=True)
        del run_engine, run_raw
        res["engine_shared_bf16"] = min(eng, key=lambda r: r["iteration_s"])
        res["raw_hf_bf16"] = min(raw, key=lambda r: r["iteration_s"])
        res["overhead"] = res["engine_shared_bf16"]["iteration_s"] / res["raw_hf_bf16"]["iteration_s"]
        if not args.skip_separate:
            run_sep = engine_setup(make_config(model, "separate", "no", args.device, args))
            run_sep(epochs=1)
            res["engine_separate_fp32"] = run_sep()
            del run_sep
            print(key, "separate fp32", res["engine_separate_fp32"], flush=True)
            res["speedup_vs_separate_fp32"] = (
                res["engine_separate_fp32"]["iteration_s"] / res["engine_shared_bf16"]["iteration_s"]
            )
        report["results"][key] = res
        print(json.dumps({key: res}, indent=2), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
