"""parametrization=completep (μP + CompleteP's depth rules, α = 1): at its base depth it is mup bit for bit and its
width rules equal the `mup` package's (set_base_shapes + MuAdamW); above it every residual branch is scaled by
base_depth / n_layers (checked against the mup model with each branch's last matrix scaled by hand, and against the
export's fold), AdamW's ε of every parameter inside a block by the same factor; a bad base_depth is one line."""

from __future__ import annotations

import mup
import pytest
import torch

from diffllm.errors import UserError
from diffllm.model.config import ModelConfig
from diffllm.model.decoder import DecoderLM
from diffllm.model.parametrization import folded
from diffllm.train.config import OptimConfig
from diffllm.train.optim import UpdateGate, build_optimizer, param_groups

ARCHS = ("transformer", "diff", "diff2")
BASE, HEAD_DIM, WD = 48, 8, 0.1  # d_model 48: the SwiGLU width int(8/3 d) scales exactly


def config(arch: str, width: int, layers: int = 2, **kw) -> ModelConfig:
    return ModelConfig(
        arch=arch, d_model=width, n_heads=width // HEAD_DIM, n_layers=layers, vocab_size=200, base_width=BASE, **kw
    )


def built(cfg: ModelConfig) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(cfg)


def train(model: DecoderLM, steps: int = 3) -> list[float]:
    opt = build_optimizer(model, OptimConfig(lr=1e-2, eps=1e-8, weight_decay=WD), UpdateGate())
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = 1e-2 * g.get("lr_mult", 1.0)  # what train/step.py does
        tokens = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("arch", ARCHS)
def test_at_its_base_depth_completep_is_mup_bit_for_bit(arch):
    mu = built(config(arch, 4 * BASE, parametrization="mup"))
    cp = built(config(arch, 4 * BASE, parametrization="completep", base_depth=2))
    assert train(mu) == train(cp)
    for key, value in mu.state_dict().items():
        assert torch.equal(value, cp.state_dict()[key]), key


@pytest.mark.parametrize("arch", ARCHS)
def test_its_width_rules_equal_the_mup_package(arch):
    """set_base_shapes from a base and a delta model, then MuAdamW: each parameter's lr multiplier and weight decay
    equal completep's groups at a fixed depth (4 layers, base depth 4)."""
    model = built(config(arch, 4 * BASE, 4, parametrization="completep", base_depth=4))
    base, delta = DecoderLM(config(arch, BASE, 4)), DecoderLM(config(arch, 2 * BASE, 4))
    mup.set_base_shapes(model, base, delta=delta, rescale_params=False, do_assert=False)
    ours = {id(p): (g["lr_mult"], g["weight_decay"]) for g in param_groups(model, WD) for p in g["params"]}
    plain = [{"params": [p], "weight_decay": ours[id(p)][1] if ours[id(p)][0] == 1 else WD} for p in model.parameters()]
    reference = {
        id(p): (g["lr"], g["weight_decay"]) for g in mup.MuAdamW(plain, lr=1.0).param_groups for p in g["params"]
    }
    assert reference.keys() == ours.keys()
    for key, value in reference.items():
        assert ours[key] == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_branches_are_scaled_by_base_depth_over_depth(arch):
    """8 layers over a base depth of 2: each branch x 1/4, i.e. the mup model whose out_proj and down_proj (the last
    matrix of each branch, no bias) are quartered; the export's fold gives an sp model with the same logits."""
    cfg = config(arch, 2 * BASE, 8, parametrization="completep", base_depth=2)
    cp = built(cfg).double()
    mu = DecoderLM(config(arch, 2 * BASE, 8, parametrization="mup")).double()
    state = {
        k: v / 4 if k.endswith((".attn.out_proj.weight", ".mlp.down_proj.weight")) else v
        for k, v in cp.state_dict().items()
    }
    mu.load_state_dict(state)
    tokens = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(cp(tokens), mu(tokens), rtol=1e-12, atol=1e-12)
    sp_cfg, sp_state = folded(cfg, cp.state_dict())
    assert sp_cfg.parametrization == "sp" and sp_cfg.base_depth is None
    sp = DecoderLM(sp_cfg).double()
    sp.load_state_dict(sp_state)
    torch.testing.assert_close(sp(tokens), cp(tokens), rtol=1e-10, atol=1e-10)


def test_adam_eps_inside_the_blocks_scales_with_depth():
    """6 layers over a base depth of 2: ε x 1/3 for every parameter under layers.*, ε elsewhere (embedding, final norm,
    head); lr multipliers and weight decays stay mup's."""
    model = built(config("diff", 2 * BASE, 6, parametrization="completep", base_depth=2))
    opt = build_optimizer(model, OptimConfig(lr=1e-2, eps=1e-6, weight_decay=WD), UpdateGate())
    eps = {id(p): g["eps"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert eps[id(p)] == pytest.approx(1e-6 / 3 if name.startswith("layers.") else 1e-6, rel=1e-15), name
    mu = built(config("diff", 2 * BASE, 6, parametrization="mup"))
    assert hyper(model) == hyper(mu)


def hyper(model: DecoderLM) -> dict[str, tuple[float, float]]:
    """parameter name -> (lr multiplier, weight decay) of its group."""
    group = {id(p): g for g in param_groups(model, WD) for p in g["params"]}
    return {n: (group[id(p)]["lr_mult"], group[id(p)]["weight_decay"]) for n, p in model.named_parameters()}


def test_a_bad_base_depth_is_one_line():
    with pytest.raises(UserError, match=r"model.base_depth: must be a positive integer or null, got 0"):
        config("transformer", BASE, parametrization="completep", base_depth=0)
