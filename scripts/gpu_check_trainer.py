"""The trainer on the GPU: one real step loop per arch at 1.4B (`Trainer(TrainConfig.from_hydra(cfg), hooks=[...])`:
the DeepSpeed engine, ZeRO-2, bf16, NCCL, trainer=paper-scaling and optim=paper-scaling, the prepared Shakespeare
shards through the real loader), its tokens/s, MFU and steady-state peak memory beside what `diffllm plan` predicts
and beside the bare forward+backward loop of the same model (what the framework costs); first, one checkpoint save
and a resume from it, checked against the uninterrupted run. Rows go to gpu_check.py's results file.

Per GPU, a step is the paper's per-GPU work on one 8-GPU node: 16 sequences of 2048 tokens (paper-scaling's 128
sequences / 8), as micro-batch 8 x accumulation 2, or the largest micro-batch the planner says fits (x more
accumulation). The measured runs are ended by their hook after the last measured step, so they never write a
checkpoint (~17 GiB at 1.4B); the save is the resume check's, on a small model.

Needs data from `scripts/gpu_wheels.sh` ($GPU_CHECK_CARRY/data). `GPU_CHECK_SMOKE=1`: tiny presets, seq 128, a few
steps, on CPU (gloo, fp32). GPU_CHECK_TRAINER_BUDGET_S bounds the whole part (an arch that would not finish in what is
left prints as skipped); GPU_CHECK_OVERRIDES adds Hydra overrides to every run (e.g. trainer.compile=false)."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import DEVICE, SMOKE, device_label, record  # noqa: E402

import diffllm.cli.registry  # noqa: F401 - declares the commands' typed configs
from diffllm.config import compose  # noqa: E402
from diffllm.hardware import GPUS, peak_tflops  # noqa: E402
from diffllm.model import DecoderLM  # noqa: E402
from diffllm.model.accounting import model_stats  # noqa: E402
from diffllm.model.registry import variants  # noqa: E402
from diffllm.scaling.planner import GiB, PlanConfig, make_plan  # noqa: E402
from diffllm.train.config import TrainConfig  # noqa: E402
from diffllm.train.hooks import Hook  # noqa: E402
from diffllm.train.loop import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CARRY = Path(os.environ.get("GPU_CHECK_CARRY") or ROOT / ".gpu-check").resolve()
SIZE, SEQ, MICRO, SEQS_PER_STEP = ("tiny", 128, 2, 4) if SMOKE else ("1.4b", 2048, 8, 16)
STEPS, WARMUP = (6, 2) if SMOKE else (16, 4)  # tokens/s over the steps after WARMUP (first-step setup, allocator)
BARE_STEPS = 2 if SMOKE else 8
RESUME = ("diff-tiny", 64, 4, 2) if SMOKE else ("diff-small", 2048, 6, 3)  # model, seq, steps, saved at
DEADLINE = time.monotonic() + float(os.environ.get("GPU_CHECK_TRAINER_BUDGET_S", "165"))  # gpu_check.sh sets it
EXTRA = os.environ.get("GPU_CHECK_OVERRIDES", "").split()


class _Measured(Exception):
    """Ends a measured run after its last measured step: no final validation, no 17 GiB checkpoint."""


class Measure(Hook):
    """Wall time and peak memory over steps WARMUP+1..steps, every step's loss; ends the run after `steps` (if
    `stop`), or times the save that follows step `save_at`."""

    def __init__(self, steps: int, stop: bool = True, save_at: int = 0):
        self.steps, self.stop, self.save_at = steps, stop, save_at
        self.losses: dict[int, float] = {}
        self.t0 = self.seconds = self.saved_s = 0.0
        self.peak = 0

    def on_step_start(self, view) -> None:
        if view.state.step == WARMUP:
            sync()
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

    def on_step_end(self, view, record) -> None:
        self.losses[view.state.step] = record["loss"]
        if view.state.step == self.save_at:
            self.t_save = time.perf_counter()
        if view.state.step == self.steps and self.stop:
            sync()
            self.seconds = time.perf_counter() - self.t0
            self.peak = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0
            raise _Measured

    def on_save(self, view, tag: str) -> None:
        if view.state.step == self.save_at:
            self.saved_s = time.perf_counter() - self.t_save


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def gpu_key() -> str:
    """The planner's GPU type for this device (diffllm/hardware.py's table, in its match order); h100 on CPU."""
    name = torch.cuda.get_device_name().upper() if DEVICE == "cuda" else "H100"
    return next((g.name for g in GPUS.values() if any(m in name for m in g.match)), "h100")


def vocab() -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(CARRY / "data/tokenizer.json")).get_vocab_size(with_added_tokens=True)


def overrides(
    model: str, seq: int, micro: int, accum: int, steps: int, run_dir: Path, save_every: int = 0, resume: str = "none"
) -> list[str]:
    """The paper preset's trainer and optimizer, shortened: a budget of `steps` steps, validation of 2 batches at the
    start only, a save every `save_every` steps (0: none before the end), no W&B; the prepared shards and their
    tokenizer."""
    return [
        f"model={model}",
        f"model.max_seq_len={max(seq, 128)}",
        "trainer=paper-scaling",
        "trainer.zero_stage=2",  # paper-scaling's is 1; one GPU of a multi-GPU run at ZeRO-2 (issue 53)
        "optim=paper-scaling",
        f"data.seq_len={seq}",
        f"data.prepared_dir={CARRY / 'data/shakespeare'}",
        f"data.tokenizer.path={CARRY / 'data/tokenizer.json'}",
        f"trainer.micro_batch_size={micro}",
        f"trainer.global_batch_tokens={micro * seq * accum}",
        f"trainer.tokens={micro * seq * accum * steps}",
        "trainer.val_batches=2",
        f"trainer.val_tokens={16 * seq}",
        f"trainer.save_every_steps={save_every or 10**6}",
        "trainer.save_every_minutes=0",
        "trainer.keep_last=3",
        f"trainer.resume={resume}",
        "logging.wandb=disabled",
        f"run_dir={run_dir}",
        *EXTRA,
    ]


def train(args: list[str], hook: Measure) -> dict:
    """One run; what the check reads of it (its config and precision) once its engine is released."""
    trainer = Trainer(TrainConfig.from_hydra(compose("train", args)), hooks=[hook])
    try:
        code = trainer.run()
    except _Measured:
        code = 0
    finally:
        if getattr(trainer, "engine", None) is not None:
            trainer.engine.destroy()  # DeepSpeed keeps module references of its own until then
    if code != 0:
        raise RuntimeError(f"the trainer exited with code {code}")
    out = {"cfg": trainer.cfg, "precision": trainer.precision}
    del trainer
    free()
    return out


def resume_check(work: Path) -> None:
    """Run A trains `steps` steps and saves at `save_at`; run B resumes from that checkpoint in a run directory of
    its own and trains to the end: its losses are A's (bit for bit on CPU; on a GPU non-deterministic kernels such
    as flash attention's backward may move the last bits)."""
    model, seq, steps, save_at = RESUME
    a, b = Measure(steps, stop=False, save_at=save_at), Measure(steps, stop=False)
    train(overrides(model, seq, MICRO, 2, steps, work / "A", save_every=save_at), a)
    ckpt = work / "A/checkpoints" / f"step{save_at}"
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    train(overrides(model, seq, MICRO, 2, steps, work / "B", save_every=save_at, resume=str(ckpt)), b)
    later = range(save_at + 1, steps + 1)
    same = all(a.losses[s] == b.losses[s] for s in later)
    diff = max((abs(a.losses[s] - b.losses[s]) for s in later if None not in (a.losses[s], b.losses[s])), default=0)
    record(
        part="checkpoint",
        model=model,
        setting="ZeRO-2, save + resume",
        shape=f"{seq} x {MICRO}",
        result=f"saved step {save_at} ({size / 2**20:.1f} MiB, {a.saved_s:.1f} s); resumed steps {later[0]}-{steps}: "
        + ("losses equal bit for bit" if same else f"max |loss diff| {diff:.3g}"),
    )


def plan_for(model_cfg, micro: int, seqs: int):
    """`diffllm plan` for one GPU of this type at ZeRO-2 without checkpointing or offload: the row at `micro` (or, for
    micro 0, the largest micro-batch that fits and divides `seqs`)."""
    pc = PlanConfig(
        seq_len=SEQ,
        global_batch_tokens=str(seqs * SEQ),
        tokens=str(seqs * SEQ * STEPS),
        gpus_per_node=1,
        gpu=gpu_key(),
        zero_stage=2,
        activation_checkpointing=False,
        offload=False,
        micro_batch_size=micro or None,
    )
    return make_plan(model_cfg, pc).rows[0]


def bare_loop(model_cfg, micro: int) -> tuple[float, int]:
    """fwd+bwd of the same model in bf16 (fp32 on CPU), no engine, no optimizer, no loader: tokens/s, peak bytes."""
    torch.manual_seed(0)
    with torch.device(DEVICE):  # initialised on the device: a 1.4B init on the host takes tens of seconds
        model = DecoderLM(model_cfg).to(torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    tokens = torch.randint(0, model_cfg.vocab_size, (micro, SEQ + 1), device=DEVICE)
    for i in range(2 + BARE_STEPS):  # 2 warm-up steps
        if i == 2:
            sync()
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
        model(tokens[:, :-1], targets=tokens[:, 1:]).backward()
        model.zero_grad(set_to_none=False)
    sync()
    tps = BARE_STEPS * micro * SEQ / (time.perf_counter() - t0)
    return tps, torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


def loss(x: Optional[float]) -> str:
    return "non-finite" if x is None else f"{x:.3f}"


def gib(x: float) -> str:
    return f"{x / GiB:.1f}" if x else "n/a"


def arch_check(arch: str, work: Path, peak_flops: Optional[float]) -> None:
    """The trainer's row and the bare loop's row of `arch` at SIZE."""
    name = f"{arch}-{SIZE}"
    model_cfg = TrainConfig.from_hydra(compose("train", overrides(name, SEQ, MICRO, 1, STEPS, work / name))).model
    model_cfg = dataclasses.replace(model_cfg, vocab_size=vocab())  # as the trainer sets it (the tokenizer's)
    micro = min(MICRO, plan_for(model_cfg, 0, SEQS_PER_STEP).micro_batch)
    if not micro:
        record(part="trainer", model=name, result="skipped: diffllm plan says micro-batch 1 does not fit")
        return
    accum, plan = SEQS_PER_STEP // micro, plan_for(model_cfg, micro, SEQS_PER_STEP)
    hook = Measure(STEPS)
    run = train(overrides(name, SEQ, micro, accum, STEPS + 1, work / name), hook)
    t = run["cfg"].trainer
    flops = model_stats(run["cfg"].model, SEQ).flops_per_token
    mfu = lambda tps: f"{tps * flops / (peak_flops * 1e12):.1%}" if peak_flops else "n/a"
    tps = (STEPS - WARMUP) * SEQS_PER_STEP * SEQ / hook.seconds
    record(
        part="trainer",
        model=name,
        setting=f"ZeRO-{t.zero_stage}, {run['precision']}, {'nccl' if DEVICE == 'cuda' else 'gloo'}"
        + (", compiled" if t.compile else ""),
        shape=f"{SEQ} x {micro} (accum {accum})",
        tokens_s=f"{tps:,.0f}",
        mfu=mfu(tps),
        memory=f"{gib(hook.peak)} ({plan.total / GiB:.1f})",
        result=f"steps {WARMUP + 1}-{STEPS} timed; loss {loss(hook.losses[1])} -> {loss(hook.losses[STEPS])}",
    )
    bare, bare_peak = bare_loop(run["cfg"].model, micro)
    free()
    record(
        part="bare fwd+bwd",
        model=name,
        setting="no engine, optimizer or loader",
        shape=f"{SEQ} x {micro}",
        tokens_s=f"{bare:,.0f}",
        mfu=mfu(bare),
        memory=gib(bare_peak),
        result=f"trainer / bare tokens/s {tps / bare:.3f}",
    )


def main() -> None:
    os.environ.setdefault("DIFFLLM_CACHE", tempfile.mkdtemp(prefix="gpu-check-cache-"))
    print(f"device: {device_label()}, torch {torch.__version__}, carried data: {CARRY / 'data'}", flush=True)
    peak_flops = peak_tflops(torch.cuda.get_device_name()) if DEVICE == "cuda" else None
    work = Path(tempfile.mkdtemp(prefix="gpu-check-runs-"))
    parts = [("checkpoint", "resume", lambda: resume_check(work / "resume"))]
    parts += [
        ("trainer", f"{arch}-{SIZE}", lambda arch=arch: arch_check(arch, work, peak_flops))
        for arch in variants()
        if (ROOT / f"configs/model/{arch}-{SIZE}.yaml").exists()
    ]
    slowest, failures = 0.0, 0
    try:
        for part, name, run in parts:
            if time.monotonic() + slowest > DEADLINE:
                record(part=part, model=name, result="skipped: the part's time budget is spent")
                continue
            t0, failed = time.monotonic(), None
            try:
                run()
            except Exception as e:  # noqa: BLE001 - one arch's failure (an OOM, a kernel) is its row; the rest run
                traceback.print_exc()
                failed = f"failed: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
            if failed:
                record(part=part, model=name, result=failed)
                failures += 1
                free()
            slowest = max(slowest, time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    end(1 if failures else 0)


def end(code: int) -> None:
    """As `diffllm train` ends (diffllm/train/app.py): the process group destroyed, the loader's forkserver ended,
    and no interpreter teardown after torch + DeepSpeed (seconds of it)."""
    import torch.distributed as dist

    from diffllm.data.workers import end_children

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    end_children()
    os._exit(code)


if __name__ == "__main__":
    main()
