"""model.init_from: a run starts from a Hugging Face model's weights (read through diffllm.export), with the model's
architecture and a fresh optimizer at step 0; relaunching resumes the run's own checkpoints."""

from __future__ import annotations

import pytest
import torch

from diffllm.export import load_pretrained
from diffllm.runs import Run
from tests.distributed import run_train
from tests.train.helpers import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_llama(tokenizer, tmp_path_factory):
    """A randomly initialised Llama (no network), its vocabulary the session tokenizer's 1024 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("hf") / "llama"
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_init_from_an_hf_model_starts_from_its_weights_then_resumes(hf_llama, tmp_path):
    run_dir = tmp_path / "run"
    # lr 0: the run's weights must stay exactly the imported ones (weight decay is lr-scaled)
    args = TINY + [
        f"run_dir={run_dir}",
        "trainer.zero_stage=0",
        f"trainer.tokens={4 * 1024}",
        "optim.lr=0",
        "optim.min_lr=0",
        f"model.init_from={hf_llama}",
    ]
    first = run_train(args, 1, tmp_path / "logs1", launcher="plain")
    assert f"model.init_from={hf_llama}: transformer, 2 layers, d_model 64, vocab 1024" in first.output(0)
    cfg, model, _ = Run(run_dir).model(tokenizer=False)
    ref_cfg, ref = load_pretrained(hf_llama)
    assert (cfg.arch, cfg.n_layers, cfg.d_model, cfg.kv_heads, cfg.ffn_hidden) == ("transformer", 2, 64, 2, 96)
    assert all(torch.equal(model.state_dict()[k], ref[k]) for k in ref)
    assert Run(run_dir).config()["model"]["d_model"] == 64  # config.yaml records what was trained, not the preset
    assert_named_llama(run_dir)
    # a relaunch with a larger budget resumes the run's own checkpoint: same architecture, no reload of the HF weights
    more = run_train(
        [a if not a.startswith("trainer.tokens=") else f"trainer.tokens={6 * 1024}" for a in args],
        1,
        tmp_path / "logs2",
        launcher="plain",
    )
    assert "resumed from checkpoint" in more.output(0) and "model.init_from=" not in more.output(0)
    assert Run(run_dir).latest().step == 6
    assert_named_llama(run_dir)


def assert_named_llama(run_dir):
    """The run is labelled by what was loaded (the HF folder's name, its arch), never the preset's (diff-tiny):
    summary.json, config.yaml and the checkpoint's meta.json, as `sweep collect` groups runs by them."""
    run = Run(run_dir)
    assert (run.summary()["model"], run.summary()["arch"]) == ("llama", "transformer"), run.summary()
    assert (run.config()["model"]["name"], run.config()["model"]["arch"]) == ("llama", "transformer")
    assert (run.config()["model"]["n_layers"], run.latest().meta["model"]["name"]) == (2, "llama")
