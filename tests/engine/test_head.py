"""The fused LM-head reduction (``engine.models.head``, ``lm_forward(lazy_head=True)``) and the CPU
allocator setting (``engine.models.memory``).

The fused path must give the numbers of the logits path — log-probs, entropy and gradients into the
hidden states and the (tied) head weight — or every GRPO ratio, KL and step would silently change.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from engine.models.head import HeadLogits, head_token_logits, plain_head_weight
from engine.models.policy import EosBan, embedding_rows_into_grad, lm_forward, token_logprobs
from engine.rollout import tokenize_prompts


def _case(seed: int = 0, v: int = 300, h: int = 16):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    hidden = torch.randn(3, 5, h, generator=g).requires_grad_()
    actions = torch.randint(0, v, (3, 5), generator=g)
    return hidden, weight, actions


def _run(logits_or_head, hidden, weight, actions, temperature, support):
    hidden.grad = weight.grad = None
    sampled, full, entropy = token_logprobs(logits_or_head, actions, temperature, support)
    coef = torch.linspace(-1.0, 2.0, sampled.numel()).view_as(sampled)
    ((sampled * coef).sum() + 0.3 * full.sum()).backward()
    return sampled.detach(), full.detach(), entropy, hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("support", [None, EosBan(eos_id=7, steps=3)])
def test_fused_head_matches_the_logits_path_with_gradients(temperature, support):
    hidden, weight, actions = _case()
    plain = _run(hidden @ weight.t(), hidden, weight, actions, temperature, support)
    fused = _run(HeadLogits(hidden, weight), hidden, weight, actions, temperature, support)
    for name, a, b in zip(("sampled", "full", "entropy", "d hidden", "d weight"), plain, fused, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), name
    # and the values are right, not merely equal: log p(a) against a float64 log-softmax
    x = (hidden.detach() @ weight.detach().t()).double() / temperature
    truth = torch.log_softmax(x, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(fused[1].double(), truth, atol=1e-5)
    p = torch.softmax(x, -1)
    assert torch.allclose(fused[2].double(), -(p * p.log()).sum(-1), atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("support", [None, EosBan(eos_id=7, steps=3)])
def test_fused_head_under_bf16_autocast_matches_the_autocast_logits_path(temperature, support):
    """Under bf16 autocast the fused head multiplies in bf16 as autocast's linear does and reduces in
    fp32: the logits path's numbers under autocast (bf16 logits, then ``.float()``), gradients included."""
    hidden, weight, actions = _case(v=3000, h=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(hidden, weight)
    assert logits.dtype == torch.bfloat16
    plain = _run(logits, hidden, weight, actions, temperature, support)
    fused = _run(HeadLogits(hidden, weight, torch.bfloat16), hidden, weight, actions, temperature, support)
    for name, a, b in zip(("sampled", "full", "entropy", "d hidden", "d weight"), plain, fused, strict=True):
        assert b.dtype == torch.float32, name
        scale = float(a.abs().max())
        assert torch.allclose(a, b, atol=1e-2 * scale, rtol=0), (name, float((a - b).abs().max()), scale)
    # the low-precision product is really taken: the fp32 fused path differs from it by bf16 rounding
    exact = _run(HeadLogits(hidden, weight), hidden, weight, actions, temperature, support)
    assert not torch.equal(exact[1], fused[1])
    assert torch.allclose(exact[1], fused[1], atol=0.01 * float(exact[1].abs().max()))


@pytest.mark.parametrize("share", [False, True])
def test_lazy_head_under_autocast_equals_the_autocast_forward(make_policy, share):
    """``lm_forward(lazy_head=True)`` under bf16 autocast takes the fused head (it used to fall back to
    the (B, T, V) logits) and gives the autocast logits path's log-probs and gradients."""
    policy, tok = make_policy("causal")
    policy.eval()
    prompts = ["The movie was long and"] * 2 + ["A much longer prompt with clearly more tokens"] * 2
    pi, pm = tokenize_prompts(tok, prompts, 32, torch.device("cpu"), "left")
    gen = torch.randint(0, tok.vocab_size, (4, 6), generator=torch.Generator().manual_seed(5))
    results = []
    for lazy in (False, True):
        policy.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = lm_forward(
                policy.lm,
                False,
                pi,
                pm,
                gen,
                torch.ones(4, 6),
                None,
                False,
                share_prompts=share,
                lazy_head=lazy,
            )
        assert isinstance(logits, HeadLogits) == lazy
        sampled, full, _ = token_logprobs(logits, gen, 1.0, EosBan(tok.eos_token_id, 2))
        (sampled.sum() + 0.5 * full.sum()).backward()
        head = policy.lm.get_output_embeddings().weight
        results.append((sampled.detach(), full.detach(), head.grad.clone()))
    (s0, f0, g0), (s1, f1, g1) = results
    assert torch.allclose(s0, s1, atol=0.05) and torch.allclose(f0, f1, atol=0.05)
    assert torch.allclose(g0, g1, atol=0.02 * float(g0.abs().max()))


def test_fused_head_eos_ban_where_eos_is_most_likely():
    """Rows where p(EOS) > 1/2 take the exact normaliser (the closed form would lose precision)."""
    hidden, weight, actions = _case(seed=1)
    with torch.no_grad():
        weight[7] = hidden.detach()[0, 0] * 3.0  # EOS dominates row (0, 0)
    x = (hidden.detach() @ weight.detach().t()).double()
    assert torch.softmax(x, -1)[0, 0, 7] > 0.5
    support = EosBan(eos_id=7, steps=2)
    plain = _run(hidden @ weight.t(), hidden, weight, actions, 1.0, support)
    fused = _run(HeadLogits(hidden, weight), hidden, weight, actions, 1.0, support)
    for a, b in zip(plain, fused, strict=True):
        assert torch.isfinite(b).all() and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    banned = x.clone()
    banned[..., :2, 7] = float("-inf")
    truth = torch.log_softmax(banned, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(fused[0].double(), truth, atol=1e-5)


def test_fused_logsumexp_spans_row_blocks():
    """More rows than one block holds (the forward reduces the logits block by block)."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(70_000, 4, generator=g)  # > 29 rows per 2M-float block at V = 70k
    hidden = torch.randn(100, 4, generator=g)
    lse, _, _, entropy = head_token_logits(hidden, weight, None, 0.5, want_entropy=True)
    x = (hidden @ weight.t()).double() * 0.5
    assert torch.allclose(lse.double(), torch.logsumexp(x, -1), atol=1e-4)
    p = torch.softmax(x, -1)
    assert torch.allclose(entropy.double(), -(p * p.log()).sum(-1), atol=1e-3)


def test_fused_backward_runs_once():
    hidden, weight, _ = _case()
    lse, _, _, _ = head_token_logits(hidden, weight, None)
    lse.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        lse.sum().backward()


@pytest.mark.parametrize("rows_into_grad", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_lazy_head_forward_equals_the_plain_forward(make_policy, share, rows_into_grad):
    """A real (tiny GPT-2, tied embeddings) model through ``lm_forward``: the lazy head's log-probs and
    every parameter's gradient equal the logits path's, with and without shared prompts (the chosen and
    EOS logits' gradients scattered into the head's), the tied embedding's rows added by autograd
    (sparse) or, in an update loop (``embedding_rows_into_grad``), straight into ``.grad``."""
    policy, tok = make_policy("causal")
    policy.eval()
    assert plain_head_weight(policy.lm) is policy.lm.get_output_embeddings().weight
    prompts = ["The movie was long and"] * 3 + ["A much longer prompt with clearly more tokens"] * 3
    pi, pm = tokenize_prompts(tok, prompts, 32, torch.device("cpu"), "left")
    gen = torch.randint(0, tok.vocab_size, (6, 7), generator=torch.Generator().manual_seed(4))
    gm = torch.ones(6, 7)
    gm[1, 4:] = 0
    results = []
    for lazy in (False, True):
        policy.zero_grad(set_to_none=True)
        with embedding_rows_into_grad(rows_into_grad):
            logits, hidden = lm_forward(
                policy.lm, False, pi, pm, gen, gm, None, want_hidden=True, share_prompts=share, lazy_head=lazy
            )
            assert isinstance(logits, HeadLogits) == lazy
            sampled, full, entropy = token_logprobs(logits, gen, 0.9, EosBan(tok.eos_token_id, 3))
            ((sampled * gm).sum() + 0.5 * (full * gm).sum() + hidden.pow(2).mean()).backward()
        # the tied weight's gradient stays one dense tensor on both of the lazy path's embedding
        # backwards (tied_embedding_grad: sparse, or rows into .grad), and the embedding is left as it was
        emb = policy.lm.get_input_embeddings()
        assert emb.weight.grad is not None and emb.weight.grad.layout == torch.strided
        assert emb.sparse is False and "forward" not in vars(emb)
        grads = {n: p.grad.clone() for n, p in policy.lm.named_parameters() if p.grad is not None}
        results.append((sampled.detach(), full.detach(), entropy, hidden.detach(), grads))
    (s0, f0, e0, h0, g0), (s1, f1, e1, h1, g1) = results
    assert torch.allclose(s0, s1, atol=1e-5) and torch.allclose(f0, f1, atol=1e-5)
    assert torch.allclose(e0, e1, atol=1e-4) and torch.equal(h0, h1)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for name, g in g0.items():
        # summation order differs (the head's gradient is one product, not softmax minus one-hot):
        # float rounding of ~2e-5 on gradients of magnitude ~10
        assert torch.allclose(g, g1[name], atol=1e-4, rtol=1e-4), name


def _tied_loss(policy, pi, pm, gen, gm):
    logits, _ = lm_forward(policy.lm, False, pi, pm, gen, gm, None, want_hidden=False, lazy_head=True)
    sampled, _, _ = token_logprobs(logits, gen, 1.0, None)
    return (sampled * gm).sum()


def _graph_names(t):
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


def test_embedding_rows_into_grad_accumulates_and_skips_padding(make_policy):
    """The update loop's path: two backwards before a step sum into one dense ``.grad`` as autograd's
    own path does; the padding row gets nothing; outside the opt-in, ``torch.autograd.grad`` (TRPO)
    still returns the embedding's rows in the weight's gradient."""
    policy, tok = make_policy("causal")
    policy.eval()
    emb = policy.lm.get_input_embeddings()
    pi, pm = tokenize_prompts(
        tok, ["The movie was", "A much longer prompt than that"], 16, torch.device("cpu"), "left"
    )
    gen = torch.randint(0, tok.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    gm = torch.ones(2, 5)
    grads = []
    for rows_into_grad in (False, True):
        policy.zero_grad(set_to_none=True)
        with embedding_rows_into_grad(rows_into_grad):
            for _ in range(2):
                loss = _tied_loss(policy, pi, pm, gen, gm)
                # the path taken: the rows-into-grad lookup in the update loop only
                assert ("_EmbeddingRowsIntoGradBackward" in _graph_names(loss)) == rows_into_grad
                loss.backward()
        assert emb.weight.grad.layout == torch.strided
        grads.append(emb.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-5)
    # outside the opt-in, autograd.grad returns the whole gradient, rows included (two backwards = 2x)
    policy.zero_grad(set_to_none=True)
    (w,) = torch.autograd.grad(_tied_loss(policy, pi, pm, gen, gm), [emb.weight])
    assert torch.allclose(2 * w, grads[0], atol=1e-5, rtol=1e-5)
    # a padding row gets no gradient from the lookup (nn.Embedding's rule), on both paths
    emb.padding_idx = int(pi[0, 0])
    try:
        per_path = []
        for rows_into_grad in (False, True):
            policy.zero_grad(set_to_none=True)
            with embedding_rows_into_grad(rows_into_grad):
                _tied_loss(policy, pi, pm, gen, gm).backward()
            per_path.append(emb.weight.grad.clone())
        assert torch.allclose(per_path[0], per_path[1], atol=1e-5, rtol=1e-5)
    finally:
        emb.padding_idx = None


def test_models_without_a_plain_head_keep_the_logits_path(make_policy):
    policy, _ = make_policy("seq2seq")
    assert plain_head_weight(policy.lm) is None  # T5 scales its hidden states before the head
    causal, _ = make_policy("causal")
    causal.lm.config.model_type = "gemma2"  # soft-capped logits: not a plain head
    assert plain_head_weight(causal.lm) is None
    hooked, _ = make_policy("causal")
    assert plain_head_weight(hooked.lm) is not None
    # a hook on the model itself (FSDP2 all-gathers its root group in one) would be skipped by the
    # lazy path, which calls the base model: such models keep the logits path
    handle = hooked.lm.register_forward_pre_hook(lambda module, args: None)
    assert plain_head_weight(hooked.lm) is None
    handle.remove()
    assert plain_head_weight(hooked.lm) is not None


_PROBE = textwrap.dedent(
    """
    import ctypes, sys, torch
    class M(ctypes.Structure):  # glibc's struct mallinfo2
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = M
    if sys.argv[1] == "retain":
        from engine.models.memory import retain_freed_memory
        assert retain_freed_memory() and retain_freed_memory()
    before = libc.mallinfo2().hblkhd  # blocks mapped at import stay mapped either way
    x = torch.ones(64 << 18)  # 64 MB
    mapped = libc.mallinfo2().hblkhd - before
    del x
    kept = libc.mallinfo2().fordblks
    print(mapped, kept)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is the subject")
def test_retained_memory_serves_big_tensors_from_the_heap_and_keeps_them():
    """Without the setting a 64 MB tensor is its own mmap, unmapped when freed; with it the tensor
    comes from the heap and its pages stay in the process for the next step's tensors."""
    out = {}
    for mode in ("default", "retain"):
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120, check=True
        )
        out[mode] = [int(v) for v in proc.stdout.split()]
    mb = 1 << 20
    assert out["default"][0] >= 64 * mb  # mmap'd
    assert out["retain"][0] < mb and out["retain"][1] >= 64 * mb  # heap, then kept free in the heap


def test_untied_or_critic_embeddings_keep_dense_gradients(make_policy):
    """A critic's pass (``need_logits=False``) uses the input embedding only as a stand-in weight: its
    embedding's gradient must stay dense (an optimizer such as fused AdamW refuses a sparse ``.grad``)."""
    policy, tok = make_policy("causal")
    pi, pm = tokenize_prompts(tok, ["A prompt", "Another prompt here"], 16, torch.device("cpu"), "left")
    gen = torch.randint(0, tok.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    _, hidden = lm_forward(
        policy.lm,
        False,
        pi,
        pm,
        gen,
        torch.ones(2, 5),
        None,
        want_hidden=True,
        lazy_head=True,
        need_logits=False,
    )
    hidden.pow(2).mean().backward()
    grad = policy.lm.get_input_embeddings().weight.grad
    assert grad is not None and grad.layout == torch.strided and grad.abs().sum() > 0
