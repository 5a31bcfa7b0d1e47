"""A new attention is one file: a gated-attention Transformer (softmax attention whose output is multiplied per head by
sigmoid(x W_g)), written to a temporary module and registered through $DIFFLLM_VARIANTS with no other file of the
package touched, trains, resumes exactly after SIGTERM, evaluates (ppl, needle, attention, outliers), exports as
remote code that transformers loads with equal logits, and sweeps. The module below is docs/model.md's worked
example."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from diffllm.runs import Run, read_metrics
from tests.distributed import REPO, base_env
from tests.train.helpers import TINY, resumes_exactly_after_sigterm

pytestmark = pytest.mark.slow
registry = importlib.import_module("diffllm.model.registry")
STEPS = 6

TOY = '''"""Gated attention: softmax attention whose output is multiplied per head by sigmoid(x W_g)."""
import torch
from torch import nn

from diffllm.model.registry import register
from diffllm.model.standard_attention import StandardAttention, TransformerEquations


class GatedEquations(TransformerEquations):
    """The Transformer's, each head's output times sigmoid(x W_g). Torch only: the remote export ships it."""

    def __init__(self, cfg, depth):
        super().__init__(cfg, depth)
        self.gate_proj = nn.Linear(cfg.d_model, cfg.n_heads, bias=False)

    def mix(self, x, o):
        """o (B, H, T, *) -> each head times its gate (B, H, T, 1), per token."""
        return o * torch.sigmoid(self.gate_proj(x)).transpose(1, 2).unsqueeze(-1)


@register
class GatedAttention(StandardAttention, GatedEquations):
    """The Transformer's variant (heads, accounting) with the gated equations."""

    arch, label, color, baseline = "gated", "Gated attention", "tab:purple", False

    def init_parameter(self, name, p, cfg):
        if name == "gate_proj.weight":
            p.zero_()  # every gate starts at 0.5
        else:
            super().init_parameter(name, p, cfg)

    @classmethod
    def attention_params(cls, cfg):
        return super().attention_params(cfg) + cfg.d_model * cfg.n_heads
'''
PRESET = """defaults:
  - arch/common@_here_
  - size/tiny@_here_
  - _self_
name: gated-tiny
arch: gated
rope_interleaved: false
"""
SWEEP = """name: toy
models: [gated-tiny]
tokens: [4096]
round_tokens_to: 1024
seeds: [1]
overrides: [model.d_model=64, model.n_layers=2, data.seq_len=64, data.tokenizer.vocab_size=1024,
            trainer.micro_batch_size=4, trainer.global_batch_tokens=1024, trainer.val_batches=2,
            trainer.val_tokens=4096, trainer.save_every_steps=0, optim.warmup_steps=1]
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """(env for child processes, config dir): the toy module on PYTHONPATH and in $DIFFLLM_VARIANTS, its preset and a
    sweep in a user config dir; this process sees them too, and forgets the variant afterwards."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "gated_attention.py").write_text(TOY)
    for group, name, text in (("model", "gated-tiny", PRESET), ("sweep", "toy", SWEEP)):
        (tmp_path / "configs" / group).mkdir(parents=True, exist_ok=True)
        (tmp_path / "configs" / group / f"{name}.yaml").write_text(text)
    env = {
        "DIFFLLM_VARIANTS": "gated_attention",
        "DIFFLLM_CONFIG_PATH": str(tmp_path / "configs"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "toy"), str(REPO)]),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(tmp_path / "toy"))
    yield env, tmp_path / "configs"
    registry._REGISTRY.pop("gated", None)
    sys.modules.pop("gated_attention", None)


def test_toy_variant_trains_resumes_evaluates_exports_and_sweeps(tokenizer, toy, tmp_path):
    env, configs = toy
    assert "gated" in registry.variants()
    assert [c.__name__ for c in registry.variant("gated").equations()] == ["TransformerEquations", "GatedEquations"]

    def args(run_dir):
        return TINY + [
            "model=gated-tiny",
            f"run_dir={run_dir}",
            f"trainer.tokens={STEPS * 1024}",
            "trainer.save_every_steps=0",
            "trainer.val_every=3",
            "trainer.zero_stage=0",
        ]

    # train, and resume exactly after SIGTERM
    ref = resumes_exactly_after_sigterm(args, tmp_path, stop_at=2, steps=STEPS, env=env)
    losses = [m["loss"] for m in read_metrics(ref) if m.get("loss") is not None]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    cfg, model, tok = Run(ref).model()
    assert type(model.layers[0].attn).__name__ == "GatedAttention" and model.layers[0].attn.gate_proj.weight.any()

    # evaluate: the commands, in this process
    from diffllm.eval import attention, needle, outliers, ppl

    out = tmp_path / "eval"
    ppl.main([f"run={ref}", "max_tokens=256", f"out={out}"])
    needle.main([f"run={ref}", "n_needles=[1]", "depths=[0,100]", "lengths=[64]", "trials=1", f"out={out}"])
    attention.main([f"run={ref}", "depths=[50]", "length=64", "trials=1", f"out={out}"])
    outliers.main([f"run={ref}", "tokens=128", "bits=[8]", "cloze_items=4", f"out={out}"])
    assert json.loads((out / "ppl.json").read_text())["arch"] == "gated"
    assert json.loads((out / "attention.json").read_text())["normalisation"] == "softmax rows"
    q = json.loads((out / "outliers.json").read_text())["quantised_loss"]
    assert abs(q["8"] - q["fp32"]) < 0.05
    from diffllm.eval.maps import scores_transformed

    ids = torch.tensor([tok.encode("ROMEO: But soft, what light through yonder window breaks?")])
    with torch.no_grad(), scores_transformed(model, None):  # the variant's output rebuilt from its maps
        assert torch.allclose(model(ids), Run(ref).model()[1](ids), atol=2e-5)

    # export as remote code: no diffllm import in the bundle, equal logits in transformers
    import transformers

    from diffllm.export.hf import export_run

    done = export_run(ref, tmp_path / "hf", format="auto")
    assert done.format == "remote"
    bundle = "".join(p.read_text() for p in (tmp_path / "hf").glob("*.py"))
    assert "class GatedEquations" in bundle and not re.search(r"^\s*(from|import)\s+diffllm\b", bundle, re.M)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-5

    # sweep: one real tiny run from the user's sweep config, then collect
    sweep_dir = tmp_path / "sweep"
    cli_env = base_env(env)
    for cmd in (["sweep", "sweep=toy", f"sweep_dir={sweep_dir}"], ["sweep", "collect", f"sweep_dir={sweep_dir}"]):
        res = subprocess.run(
            [sys.executable, "-m", "diffllm.cli", *cmd],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env=cli_env,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summaries = list(sweep_dir.rglob("summary.json"))
    assert len(summaries) == 1 and json.loads(summaries[0].read_text())["arch"] == "gated"
    assert "gated" in res.stdout + "".join(p.read_text() for p in sweep_dir.glob("*.md"))
