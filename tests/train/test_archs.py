"""Every registered architecture (Transformer, Diff, Diff V2, MLA) trains through the real trainer and resumes
exactly: a run stopped by SIGTERM and relaunched logs the same losses, gradient norms and validation losses, bit for
bit, as the uninterrupted run of the same architecture."""

from __future__ import annotations

import pytest

from diffllm.model import variants
from tests.train.helpers import resumes_exactly_after_sigterm, tiny

pytestmark = pytest.mark.slow
STEPS = 8


@pytest.mark.parametrize("arch", list(variants()))
def test_each_arch_resumes_exactly_after_sigterm(tokenizer, tmp_path, arch):
    def args(run_dir):
        return tiny(
            run_dir,
            2,
            f"model={arch}-tiny",
            "model.d_model=64",
            "model.n_layers=2",
            f"trainer.tokens={STEPS * 1024}",
            "trainer.save_every_steps=0",
            "trainer.val_every=4",
        )

    resumes_exactly_after_sigterm(args, tmp_path, stop_at=3, steps=STEPS)
