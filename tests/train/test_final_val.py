"""The final validation (summary.json's final_val_loss) is the whole held-out set as `diffllm eval ppl` scores the
finished run: the same number, on one rank and split over two (ZeRO-0 and ZeRO-3)."""

from __future__ import annotations

import json

import pytest

from diffllm.eval.ppl import main as eval_ppl
from tests.distributed import run_train
from tests.train.helpers import TINY


@pytest.mark.parametrize("ranks, stage", [(1, 0), (2, 0), pytest.param(2, 3, marks=pytest.mark.slow)])  # ZeRO-3: slow
def test_final_val_loss_is_eval_ppls_number(ranks, stage, tokenizer, tmp_path, capsys):
    run = tmp_path / "run"
    run_train(TINY + [f"run_dir={run}", f"trainer.zero_stage={stage}", "trainer.tokens=4096"], ranks, tmp_path / "logs")
    summary = json.loads((run / "summary.json").read_text())
    eval_ppl([f"run={run}", "max_tokens=4096", f"out={tmp_path / 'ppl'}"])  # trainer.val_tokens=4096 (TINY)
    ppl = json.loads((tmp_path / "ppl" / "ppl.json").read_text())["sources"]
    assert list(ppl) == list(summary["final_val"]["sources"]) == ["plays-heldout"]  # shakespeare: one held-out source
    assert summary["final_val"]["tokens"] == ppl["plays-heldout"]["tokens"] > 4000  # every document token scored
    assert summary["final_val_loss"] == pytest.approx(ppl["plays-heldout"]["loss"], abs=1e-5)
    assert summary["final_val_loss"] != summary["last_val_loss"]  # the in-loop set is another (a spread subset)
