"""parametrization=mup against the reference implementation: the `mup` package's set_base_shapes + MuAdamW on the same
model give the same per-parameter lr multipliers, weight decays and init scales as diffllm's declarations, and its
MuReadout the same logits (and MLA's latent maps); at width_mult 1 mup is sp bit for bit; a variant that declares
nothing is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import mup
import pytest
import torch

from diffllm.errors import UserError
from diffllm.model import KVCache
from diffllm.model.config import ModelConfig
from diffllm.model.decoder import DecoderLM
from diffllm.model.parametrization import init_mult, treatments
from diffllm.scaling.coord_check import slope
from diffllm.train.optim import param_groups
from tests.distributed import REPO

ARCHS = ("transformer", "diff", "diff2", "mla")
BASE, HEAD_DIM, WD, STD = 48, 8, 0.1, 0.02  # d_model 48: the SwiGLU width int(8/3 d) scales exactly (128 per 48)


def config(arch: str, width: int, heads: int = 0, **kw) -> ModelConfig:
    """Head dim fixed, heads scale with width (the base shapes' rule, diffllm/model/parametrization.py); `heads`: that
    many heads at every width instead (the head dim grows)."""
    return ModelConfig(
        **{"n_layers": 2, "vocab_size": 200, "init_std": STD, **kw},
        arch=arch,
        d_model=width,
        n_heads=heads or width // HEAD_DIM,
    )


def mup_model(arch: str, width: int, heads: int = 0, **kw) -> DecoderLM:
    """Our model at `width` under mup with the `mup` package's infshapes set from a base and a delta model."""
    torch.manual_seed(0)
    base_head_dim = BASE // heads if heads else None
    model = DecoderLM(
        config(arch, width, heads, parametrization="mup", base_width=BASE, base_head_dim=base_head_dim, **kw)
    )
    base, delta = DecoderLM(config(arch, BASE, heads, **kw)), DecoderLM(config(arch, 2 * BASE, heads, **kw))
    # our readout is a plain nn.Linear (the 1/width_mult is in DecoderLM.forward): mup's assert would ask for a
    # MuReadout there, and our table must call exactly that one Linear the readout (checked below)
    mup.set_base_shapes(model, base, delta=delta, rescale_params=False, do_assert=False)
    return model


FIXED_HEAD_DIMS = {"qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
# (arch, heads: 0 grows by heads / n at every width, kw, the attention's readouts). MLA grown by heads keeps its latent
# ranks: W_DQ and W_DKV map the width to a fixed size (readouts); grown by head dim, d_c + d_r of W_DKV grows (hidden)
FAMILIES = [(arch, 0, {}, ()) for arch in ("transformer", "diff", "diff2")] + [
    ("mla", 0, {}, ("kv_a_proj_with_mqa",)),
    ("mla", 0, {"q_lora_rank": 24}, ("q_a_proj", "kv_a_proj_with_mqa")),
    ("mla", 4, {"q_lora_rank": 24}, ("q_a_proj",)),
    ("mla", 4, FIXED_HEAD_DIMS, ("q_proj", "kv_b_proj")),  # d_c grows, the heads' widths do not
]


@pytest.mark.parametrize("arch,heads,kw,latent", FAMILIES)
def test_lr_multipliers_and_weight_decay_equal_mup_adamw(arch, heads, kw, latent):
    model = mup_model(arch, 4 * BASE, heads, **kw)
    ours = {id(p): (g["lr_mult"], g["weight_decay"]) for g in param_groups(model, WD) for p in g["params"]}
    decays = {id(p): g["weight_decay"] for g in param_groups(model, WD) for p in g["params"]}
    # MuAdamW splits each group we give it by width_mult: hand it our decay split, lr 1 -> its lr is the multiplier
    plain = [{"params": [p], "weight_decay": decays[id(p)] if ours[id(p)][0] == 1 else WD} for p in model.parameters()]
    reference = {
        id(p): (g["lr"], g["weight_decay"]) for g in mup.MuAdamW(plain, lr=1.0).param_groups for p in g["params"]
    }
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(ours) == len(reference) == len(names)
    for key, (lr, wd) in reference.items():
        assert ours[key] == pytest.approx((lr, wd), rel=1e-12), names[key]
    assert {ours[id(p)][0] for p in model.parameters()} == {1.0, 0.25}  # both rules are exercised


@pytest.mark.parametrize("arch,heads,kw,latent", FAMILIES)
def test_kinds_and_init_scales_equal_mup(arch, heads, kw, latent):
    model, m = mup_model(arch, 4 * BASE, heads, **kw), 4.0
    kinds = treatments(model)
    # the readouts: each nn.Linear with an infinite fan-in and a finite fan-out (assert_hidden_size_inf's MuReadout)
    readouts = {
        f"{n}.weight"
        for n, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and mod.weight.infshape[1].isinf() and not mod.weight.infshape[0].isinf()
    }
    assert readouts == {"lm_head.weight"} | {f"layers.{i}.attn.{p}.weight" for i in range(2) for p in latent}
    assert readouts == {n for n, kind in kinds.items() if kind == "readout"}
    for name, p in model.named_parameters():
        # mup: 2 infinite dims = matrix-like (hidden); <= 1 = vector-like
        kind = "hidden" if p.infshape.ninf() == 2 else "readout" if name in readouts else "vector"
        assert kinds[name] == kind, name
        # mup.init.normal_ draws std x (width_mult^-1/2 for matrix-like): the same draws scaled
        t = torch.empty_like(p)
        t.infshape = p.infshape
        torch.manual_seed(1)
        mup.init.normal_(t, std=1.0)
        torch.manual_seed(1)
        scale = (t / torch.randn_like(p)).flatten()[0].item()
        assert init_mult(kind, m) == pytest.approx(scale, rel=1e-6), name
        if p.dim() == 2:  # the draws we made have that std
            assert p.std().item() == pytest.approx(STD * scale, rel=0.1), name


@pytest.mark.parametrize("arch", ARCHS)
def test_readout_equals_mu_readout(arch):
    model = mup_model(arch, 4 * BASE)
    readout = mup.MuReadout(4 * BASE, model.lm_head.out_features, bias=False)
    readout.weight = model.lm_head.weight  # carries its infshape: width_mult 4
    assert model.readout_scale == pytest.approx(1 / readout.width_mult())
    tokens = torch.randint(0, 200, (2, 8))
    hidden = {}
    model.norm.register_forward_hook(lambda mod, inp, out: hidden.setdefault("h", out))
    logits = model(tokens)
    torch.testing.assert_close(logits, readout(hidden["h"]), rtol=1e-5, atol=1e-6)


def test_query_scale_makes_logits_one_over_d():
    """base_head_dim 2 with d = 8: logits q.k sqrt(2)/8, i.e. sp's q.k/sqrt(8) x 1/2 (eval's maps see them too)."""
    sp = DecoderLM(config("transformer", 64, n_layers=1))
    mu = DecoderLM(config("transformer", 64, n_layers=1, parametrization="mup", base_head_dim=2))
    mu.load_state_dict(sp.state_dict())
    x, (cos, sin) = torch.randn(1, 5, 64), (torch.ones(5, 4), torch.zeros(5, 4))
    s_sp, _ = sp.layers[0].attn.scores(x, cos, sin)
    s_mu, _ = mu.layers[0].attn.scores(x, cos, sin)
    torch.testing.assert_close(s_mu, s_sp / 2)


def adamw_step(model: DecoderLM, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    """One step on next-token cross-entropy over `tokens` (B, T + 1) -> the loss."""
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize("arch", ARCHS)
def test_mup_at_base_width_is_sp_bit_for_bit(arch):
    """Same seed, three AdamW steps: the losses and the weights of mup at width_mult 1 equal sp's exactly."""

    def losses(**kw):
        torch.manual_seed(0)
        model = DecoderLM(config(arch, 64, **kw))
        opt = torch.optim.AdamW(param_groups(model, WD), lr=1e-2)
        out = []
        for step in range(3):
            for g in opt.param_groups:
                g["lr"] = 1e-2 * (step + 1) / 3 * g.get("lr_mult", 1.0)  # what train/step.py does
            tokens = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(step))
            out.append(adamw_step(model, opt, tokens))
        return out, model.state_dict()

    (sp, sp_state), (mu, mu_state) = losses(), losses(parametrization="mup", base_width=64, base_head_dim=HEAD_DIM)
    assert sp == mu
    for key in sp_state:
        assert torch.equal(sp_state[key], mu_state[key]), key


# A variant that declares nothing: the Transformer's equations with `mup` left None (docs/model.md's worked example
# inherits the Transformer's declaration instead)
UNDECLARED = """from diffllm.model.registry import register
from diffllm.model.standard_attention import StandardAttention


@register
class UndeclaredAttention(StandardAttention):
    arch, label, color, mup = "undeclared", "Undeclared", "tab:gray", None
"""


def test_undeclared_variant_is_refused_in_one_line(monkeypatch):
    from diffllm.model import registry
    from diffllm.model.standard_attention import StandardAttention

    undeclared = type("UndeclaredAttention", (StandardAttention,), {"arch": "undeclared", "mup": None})
    monkeypatch.setitem(registry._REGISTRY, "undeclared", undeclared)
    ModelConfig(arch="undeclared")  # sp builds
    with pytest.raises(UserError, match="mup needs arch 'undeclared' to declare"):
        ModelConfig(arch="undeclared", parametrization="mup")
    with pytest.raises(UserError, match="model.parametrization: got 'mu'"):
        ModelConfig(parametrization="mu")
    with pytest.raises(UserError, match="model.base_width: must be a positive integer"):
        ModelConfig(parametrization="mup", base_width=0)


def test_undeclared_variant_cli_exit_2(tmp_path):
    """`diffllm info` on a variant registered through $DIFFLLM_VARIANTS that declares nothing, under mup: one line on
    stderr, exit 2."""
    (tmp_path / "undeclared_attention.py").write_text(UNDECLARED)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "DIFFLLM_VARIANTS": "undeclared_attention"}
    command = [sys.executable, "-m", "diffllm.cli", "info", "model=transformer-tiny", "model.arch=undeclared"]
    assert subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env).returncode == 0
    r = subprocess.run(command + ["model.parametrization=mup"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "declares nothing" in r.stderr, r.stderr


def test_mla_latent_maps_equal_mu_readout():
    """Grown by heads, MLA's W_DQ and W_DKV are readouts: each equals mup's MuReadout (input x 1/width_mult) with
    its weight, on the attention's input."""
    model = mup_model("mla", 4 * BASE, q_lora_rank=24)
    attn, seen = model.layers[0].attn, {}
    attn.register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))  # None: the args unchanged
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        getattr(attn, name).register_forward_hook(lambda mod, inp, out, name=name: seen.setdefault(name, out))
    model(torch.randint(0, 200, (2, 8)))
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        ours = getattr(attn, name)
        reference = mup.MuReadout(ours.in_features, ours.out_features, bias=False)
        reference.weight = ours.weight  # carries its infshape: width_mult 4
        assert reference.width_mult() == 4.0
        torch.testing.assert_close(seen[name], reference(seen["x"]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "heads,kw,query_scale", [(0, {"q_lora_rank": 24}, 1.0), (4, {"q_lora_rank": 24}, 0.5), (4, FIXED_HEAD_DIMS, 1.0)]
)
def test_mla_cached_decoding_equals_the_full_forward_under_mup(heads, kw, query_scale):
    """The absorbed (cached) form applies mup's query scale and input scales as the plain form does: grown by heads
    (W_DQ, W_DKV readouts), by head dim (queries x sqrt(base key width / key width) = 1/2), by d_c alone (W_UKV a
    readout, which the absorbed form reads as a matrix)."""
    model = mup_model("mla", 4 * BASE, heads, **kw).double().eval()
    assert model.layers[0].attn.query_scale == query_scale
    tokens = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(2))
    cache = KVCache(max_len=9)
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :4], cache)] + [model(tokens[:, t : t + 1], cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=0)


def lambda_travel(width: int, scaled: bool, steps: int = 10) -> float:
    """The farthest any layer's lambda gets from lambda_init in `steps` AdamW steps (lr 0.03, no decay) of Diff under
    mup at a fixed 4 heads, so the head dim d that lambda's dot products run over grows with the width."""
    torch.manual_seed(0)
    cfg = config("diff", width, 4, lambda_init=0.8, parametrization="mup", base_width=16, base_head_dim=4)
    model = DecoderLM(replace(cfg, lambda_mup_scale=scaled))
    opt = torch.optim.AdamW(param_groups(model, 0.0), lr=0.03, betas=(0.9, 0.95))
    for g in opt.param_groups:
        g["lr"] = 0.03 * g["lr_mult"]
    tokens, travel = torch.randint(0, 200, (8, 33), generator=torch.Generator().manual_seed(1)), 0.0
    for _ in range(steps):
        adamw_step(model, opt, tokens)
        with torch.no_grad():
            travel = max([travel] + [abs(layer.attn.lambda_full().item() - 0.8) for layer in model.layers])
    return travel


def test_lambda_mup_scale_keeps_lambda_s_travel_flat_in_the_head_dim():
    """Diff's lambda vectors are vector-like (constant lr), but lambda reads them through dot products over d: unscaled,
    its travel grows about as d (log-log slope over d_model 16-256 > 0.7); lambda_mup_scale (x base_head_dim / d)
    makes it flat (|slope| < 0.4). docs/model.md has the measured tables."""
    widths = [16, 32, 64, 128, 256]
    plain, scaled = (slope(widths, [lambda_travel(w, s) for w in widths]) for s in (False, True))
    assert plain > 0.7 and abs(scaled) < 0.4, (plain, scaled)
