"""The toy-variant checklist (tests/model/test_toy_variant.py) for a preset: it trains, resumes exactly after SIGTERM,
evaluates (ppl), exports with logits equal in transformers and imports back. Used by the GQA and MLA tests (slow:
real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from diffllm.model import ModelConfig

STEPS = 6


def train_resume_evaluate_export(preset: str, tmp_path: Path, *overrides: str) -> ModelConfig:
    """An uninterrupted run and one stopped by SIGTERM and relaunched log the same numbers; `eval ppl` answers; the
    auto export loads in transformers with our logits (<= 1e-4). Returns the trained run's ModelConfig."""
    import transformers

    from diffllm.eval import ppl
    from diffllm.export.hf import export_run
    from diffllm.export.hf_import import read_hf
    from diffllm.model import DecoderLM
    from diffllm.runs import Run, read_metrics
    from tests.train.helpers import TINY, resumes_exactly_after_sigterm

    def args(run_dir):
        extra = [f"trainer.tokens={STEPS * 1024}", "trainer.save_every_steps=0", "trainer.zero_stage=0"]
        return TINY + [f"model={preset}", *overrides, f"run_dir={run_dir}", *extra]

    ref = resumes_exactly_after_sigterm(args, tmp_path, stop_at=2, steps=STEPS)
    losses = [m["loss"] for m in read_metrics(ref) if m.get("loss") is not None]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    cfg, model, tok = Run(ref).model()
    assert cfg.name == preset

    ppl.main([f"run={ref}", "max_tokens=256", f"out={tmp_path / 'eval'}"])
    assert json.loads((tmp_path / "eval" / "ppl.json").read_text())["arch"] == cfg.arch

    done = export_run(ref, tmp_path / "hf", format="auto")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ids = torch.tensor([tok.encode("ROMEO: But soft, what light through yonder window breaks?")])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4, done
    back_cfg, back_sd = read_hf(tmp_path / "hf")  # `diffllm import`'s reader: the same model back
    back = DecoderLM(back_cfg).eval()
    back.load_state_dict(back_sd)
    with torch.no_grad():
        assert (back(ids) - model(ids)).abs().max().item() <= 1e-5
    return cfg
