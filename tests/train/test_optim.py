"""Parameter groups (no decay on norms, biases, lambda_*), the gated optimizers (torch AdamW; DeepSpeed's CPU Adam
where its op builds) and their one decision per step."""

from __future__ import annotations

import torch

from diffllm.model import DecoderLM, ModelConfig
from diffllm.train.optim import SkipStepAdamW, UpdateGate, param_groups


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


def test_the_gate_decides_once_per_step_from_what_every_rank_shares():
    """The gated AdamW skips a step whose shared global grad norm is not finite (NaN, inf, DeepSpeed's -1 sentinel),
    which a forced drop (a non-finite loss) or the spike judge also skip; the norm and the judge are asked once per
    step however many parameter groups DeepSpeed steps; moments and step count stay untouched by a skipped step, and
    a step that goes through equals torch's AdamW bit for bit."""
    torch.manual_seed(0)
    w, v = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))
    ref = [torch.nn.Parameter(p.detach().clone()) for p in (w, v)]
    gate = UpdateGate()
    opt = SkipStepAdamW([{"params": [w]}, {"params": [v], "weight_decay": 0.0}], gate, lr=0.1, weight_decay=0.1)
    groups = [{"params": [ref[0]]}, {"params": [ref[1]], "weight_decay": 0.0}]
    ref_opt = torch.optim.AdamW(groups, lr=0.1, weight_decay=0.1)
    asked = []

    def step_both_groups(norm: float, judge=None, force=False) -> bool:
        """As DeepSpeed's ZeRO step: the optimizer once per parameter group."""
        groups = opt.param_groups
        gate.arm(force, lambda: asked.append("norm") or norm, judge)
        for g in list(groups):
            opt.param_groups = [g]
            opt.step()
        opt.param_groups = groups
        return gate.disarm()

    g = [torch.randn(5, 3), torch.randn(4)]
    for norm in (float("nan"), float("inf"), -1.0):
        w.grad, v.grad = g[0].clone(), g[1].clone()
        assert step_both_groups(norm) and asked == ["norm"] and not opt.state
        asked.clear()
    before = [w.detach().clone(), v.detach().clone()]
    assert step_both_groups(3.0, judge=lambda: asked.append("judge") or True)  # a spike
    assert asked == ["norm", "judge"] and not opt.state and torch.equal(w, before[0]) and torch.equal(v, before[1])
    asked.clear()
    assert step_both_groups(3.0, judge=lambda: asked.append("judge") or False, force=True)  # a non-finite loss
    assert asked == [] and not opt.state
    assert not step_both_groups(3.0, judge=lambda: asked.append("judge") or False)
    for p, grad in zip(ref, g):
        p.grad = grad.clone()
    ref_opt.step()
    assert asked == ["norm", "judge"] and all(torch.equal(p, q) for p, q in zip(ref, (w, v)))
    assert [int(opt.state[p]["step"]) for p in (w, v)] == [1, 1]
    with gate.closed():  # DeepSpeed's bf16 initialisation step
        opt.step()
    assert gate.skipped and [int(opt.state[p]["step"]) for p in (w, v)] == [1, 1]
