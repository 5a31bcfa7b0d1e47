"""Parameter groups (no decay on norms, biases, lambda_*) and the skip-step AdamW, across 2 real gloo ranks."""

from __future__ import annotations

import pytest
import torch

from diffllm.model import DecoderLM, ModelConfig
from diffllm.train.optim import SkipStepAdamW, UpdateGate, param_groups
from tests.distributed import run_distributed


def test_no_weight_decay_on_norms_biases_and_lambdas():
    cfg = ModelConfig(arch="diff", d_model=64, n_layers=2, n_heads=4, vocab_size=128, qkv_bias=True, norm="layernorm")
    model = DecoderLM(cfg)
    decay, plain = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    plain_names = {names[id(p)] for p in plain["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert plain_names | decay_names == set(names.values()) and not plain_names & decay_names
    for n in plain_names:  # every no-decay parameter is a norm weight/bias, a bias, or a lambda vector
        assert n.endswith(".bias") or "norm" in n or "subln" in n or n.rsplit(".", 1)[1].startswith("lambda_"), n
    assert {f"layers.0.attn.lambda_{s}" for s in ("q1", "k1", "q2", "k2")} <= plain_names
    assert "layers.1.attn.q_proj.bias" in plain_names and "norm.weight" in plain_names
    matrices = {
        "tok_embeddings.weight",
        "lm_head.weight",
        "layers.0.attn.q_proj.weight",
        "layers.1.mlp.down_proj.weight",
    }
    assert matrices <= decay_names


def _skip_step_on_two_ranks() -> dict:
    """Rank 0 sees a NaN gradient, rank 1 a finite one: both must skip. Then a finite step matches torch's AdamW."""
    import torch.distributed as dist

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    ref = torch.nn.Parameter(w.detach().clone())
    gate = UpdateGate()
    opt = SkipStepAdamW([w], gate, lr=0.1, weight_decay=0.1)
    ref_opt = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.1)
    before = w.detach().clone()
    w.grad = torch.full_like(w, float("nan") if dist.get_rank() == 0 else 1.0)
    gate.arm(nonfinite_loss=False)
    opt.step()
    skipped = gate.disarm() and torch.equal(w.detach(), before) and not opt.state
    g = torch.randn(5, 3)
    w.grad, ref.grad = g.clone(), g.clone()
    opt.step()
    ref_opt.step()
    asked = []
    gate.arm(nonfinite_loss=False, judge=lambda: asked.append(1) or dist.get_rank() == 1)  # a spike, seen by rank 1
    w.grad = g.clone()
    after = w.detach().clone()
    opt.step()
    judged = gate.disarm() and torch.equal(w.detach(), after) and asked == [1]
    gate.arm(nonfinite_loss=True, judge=lambda: asked.append(2) or False)  # a non-finite loss: the judge is not asked
    opt.step()
    return {
        "skipped": skipped,
        "matches_adamw": torch.equal(after, ref.detach()),
        "judged": judged,
        "forced": gate.disarm() and torch.equal(w.detach(), after) and asked == [1],
        "adam_steps": int(opt.state[w]["step"]),
    }


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_skip_step_adamw_agrees_across_ranks():
    for r in run_distributed(_skip_step_on_two_ranks, world_size=2):
        assert r == {"skipped": True, "matches_adamw": True, "judged": True, "forced": True, "adam_steps": 1}
