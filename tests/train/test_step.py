"""The step against its narrow interface: a real DeepSpeed engine (one process, ZeRO-0, fp32) with its optimizer and
UpdateGate, a loader of in-memory batches, a spike guard and a hook; nothing faked. A step's record is the mean
micro-batch loss of the model before the update and the schedule's lr; a NaN loss (from a hook's on_loss) drops the
update on the engine's optimizer through the gate; a save wish made in on_step_start comes back as a save request."""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import run_distributed


def _two_steps(run_dir: str) -> dict:
    import deepspeed

    from diffllm.budget import plan_budget
    from diffllm.data.batch import Batch
    from diffllm.model import ModelConfig
    from diffllm.train.config import OptimConfig, SpikesConfig, TrainerConfig
    from diffllm.train.dist import skip_shm_op
    from diffllm.train.engine import build_engine, deepspeed_config
    from diffllm.train.hooks import Hook, Hooks
    from diffllm.train.loss import lm_loss
    from diffllm.train.optim import UpdateGate
    from diffllm.train.schedule import lr_at
    from diffllm.train.signals import StopFlag
    from diffllm.train.spikes import SpikeGuard
    from diffllm.train.step import Asks, Step
    from tests.train.helpers import make_view

    skip_shm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    trainer = TrainerConfig(zero_stage=0, micro_batch_size=2, global_batch_tokens=32, tokens=64)
    opt = OptimConfig(lr=1e-2, warmup_steps=1, schedule="linear", min_lr=1e-3)
    budget = plan_budget(trainer, 8, 1)  # 2 steps of 2 micro-batches of 2 x 8 tokens
    engine, optimizer = build_engine(
        ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, max_seq_len=8),
        trainer,
        opt,
        deepspeed_config(trainer, opt, budget, "fp32"),
        0,
        UpdateGate(),
    )
    g = torch.Generator().manual_seed(0)
    batches = [Batch(tokens=torch.randint(0, 64, (2, 9), generator=g)) for _ in range(4)]

    class NanAtStep2(Hook):
        def on_step_start(self, view):
            view.request_save(agree=True)  # a clock's wish

        def on_loss(self, view, loss):
            return loss * float("nan") if view.state.step == 1 else loss

    asks = Asks(StopFlag())
    view = make_view(run_dir, steps=budget.steps, budget=budget, request_save=asks.request_save)
    hooks = Hooks([NanAtStep2()], view)
    step = Step(view.ctx, opt, engine, optimizer, iter(batches), SpikeGuard(SpikesConfig()))
    weights = lambda: [p.detach().clone() for p in engine.module.parameters()]  # noqa: E731
    with torch.no_grad():
        engine.eval()
        want = [float(lm_loss(engine, b)) for b in batches[:2]]
        engine.train()
    before = weights()
    first, stop = step(view.state, hooks, asks)
    after_first = weights()
    saved, asks.save = asks.save, False
    second, _ = step(view.state, hooks, asks)
    return {
        "loss": first["loss"],
        "want": sum(want) / 2,
        "lr": (first["lr"], second["lr"]),
        "want_lr": (lr_at(0, 2, opt), lr_at(1, 2, opt)),
        "stop": stop,
        "saved": saved,
        "moved": any(not torch.equal(a, b) for a, b in zip(before, after_first)),
        "skipped": (first["skipped"], second["skipped"], second["loss"], second["grad_norm"]),
        "kept": all(torch.equal(a, b) for a, b in zip(after_first, weights())),
        "state": (view.state.step, view.state.tokens, view.state.skipped_steps, view.state.nonfinite_in_a_row),
        "gate_clear": not optimizer.gate.force and optimizer.gate.judge is None,
    }


@pytest.mark.slow  # DeepSpeed's import and engine in a fresh process: ~15 s
def test_a_step_records_the_mean_loss_and_a_nan_loss_drops_the_update(tmp_path):
    [r] = run_distributed(_two_steps, world_size=1, args=(str(tmp_path),))
    assert math.isclose(r["loss"], r["want"], rel_tol=1e-6) and r["lr"] == r["want_lr"]
    assert not r["stop"] and r["saved"] and r["moved"]
    assert r["skipped"] == (False, True, None, None) and r["kept"] and r["gate_clear"]
    assert r["state"] == (2, 64, 1, 1)
