"""`diffllm import`: a randomly initialised HF model saved locally (no network) becomes a diffllm run whose logits equal
HF's, and exporting that run reproduces the HF weights bit for bit; `load_pretrained` reads HF directories and runs."""

from __future__ import annotations

import pytest
import torch

from diffllm.export.hf import export_run, hf_tokenizer
from diffllm.export.hf_import import import_hf, load_pretrained
from diffllm.runs import Run
from tests.distributed import cli_here
from tests.export.helpers import TEXT

transformers = pytest.importorskip("transformers")
SHAPE = dict(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2, max_position_embeddings=128)
HF_MODELS = {
    "llama": lambda: transformers.LlamaConfig(
        **SHAPE, num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True, rope_theta=5000.0
    ),
    "stablelm": lambda: transformers.StableLmConfig(
        **SHAPE, num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.25, use_qkv_bias=True
    ),
    "diffllama": lambda: transformers.DiffLlamaConfig(**SHAPE, num_attention_heads=8, num_key_value_heads=4),
}


@pytest.fixture(scope="module")
def hf_dir(tokenizer, tmp_path_factory):
    """model_type -> a saved random HF model (norms and biases moved off their init) with the session tokenizer."""

    def make(kind: str):
        torch.manual_seed(0)
        cfg = HF_MODELS[kind]()
        model = getattr(
            transformers,
            cfg.architectures[0]
            if cfg.architectures
            else {"llama": "LlamaForCausalLM", "stablelm": "StableLmForCausalLM", "diffllama": "DiffLlamaForCausalLM"}[
                kind
            ],
        )(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 and "o_proj" not in name:
                    p.add_(torch.randn_like(p) * 0.1)
        out = tmp_path_factory.mktemp(f"hf-{kind}")
        model.save_pretrained(out)
        hf_tokenizer(tokenizer).save_pretrained(out)
        return out, model

    return make


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_import_gives_hf_logits_and_export_gives_back_the_same_weights(hf_dir, kind, tmp_path, tokenizer):
    from safetensors.torch import load_file

    src, hf = hf_dir(kind)
    cfg, run_dir = import_hf(src, tmp_path / "run")
    _, ours, tok = Run(run_dir).model()
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    assert (got - want).abs().max().item() <= 1e-5 and want.std() > 0.1
    assert tok.eos_id == tokenizer.eos_id and tok.encode(TEXT) == tokenizer.encode(TEXT)
    done = export_run(run_dir, tmp_path / "again")
    assert done.format == kind
    a, b = load_file(str(src / "model.safetensors")), load_file(str(done.out / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]


def test_load_pretrained_reads_hf_dirs_and_runs_alike(hf_dir, tmp_path):
    src, _ = hf_dir("diffllama")
    cfg, sd = load_pretrained(src)
    _, run_dir = import_hf(src, tmp_path / "run")
    cfg2, sd2 = load_pretrained(run_dir)
    assert cfg == cfg2 and sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert cfg.arch == "diff" and cfg.lambda_init is None and cfg.padded_vocab_size == 1024


@pytest.mark.slow  # the only fast test that needed `runs` (every layout trained, ~57 s); test-slow trains them anyway
def test_remote_export_imports_back(runs, tmp_path):
    layout = "diff-layernorm-partial"
    export_run(runs[layout], tmp_path / "hf", format="remote")
    cfg, sd = load_pretrained(tmp_path / "hf")
    want_cfg, model, _ = Run(runs[layout]).model()
    assert (cfg.arch, cfg.norm, cfg.rotary_pct) == (want_cfg.arch, want_cfg.norm, want_cfg.rotary_pct)
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_commands_and_a_bad_input_line(runs, hf_dir, tmp_path):
    src, _ = hf_dir("llama")
    ok = cli_here("import", str(src), f"out={tmp_path / 'run'}")
    assert ok.returncode == 0 and "imported" in ok.stdout, ok.stderr
    bad = cli_here("export", f"run={runs['diff-layernorm-partial']}", f"out={tmp_path / 'x'}", "format=diffllama")
    assert bad.returncode == 2 and bad.stderr == (
        "diffllm export: error: format=diffllama cannot represent this model exactly: DiffLlama has RMSNorm, this "
        "model has norm=layernorm; use format=remote (or auto)\n"
    ), bad.stderr


def test_bad_inputs_are_one_line_errors(fast_runs, hf_dir, tmp_path):
    src, _ = hf_dir("llama")
    import_hf(src, tmp_path / "run")
    (tmp_path / "empty").mkdir()
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(gpt2)
    cases = [
        (lambda: export_run(tmp_path / "empty", tmp_path / "x"), "empty: no checkpoints"),
        (lambda: export_run(fast_runs["stablelm"], tmp_path / "x", format="lama"), "did you mean 'llama'"),
        (lambda: export_run(fast_runs["stablelm"], tmp_path / "x", step=3), "no checkpoint at that step (steps: 6)"),
        (
            lambda: export_run(fast_runs["stablelm"], tmp_path / "x", dtype="fp8"),
            "dtype='fp8': expected one of float32, bfloat16, float16",
        ),
        (
            lambda: import_hf(gpt2, tmp_path / "y"),
            "model_type='gpt2' cannot be imported (supported: deepseek_v3, diffllama, diffllm, llama, stablelm)",
        ),
        (lambda: import_hf(src, tmp_path / "run"), "already holds checkpoints"),
        (lambda: import_hf(tmp_path / "empty", tmp_path / "z"), "not a Hugging Face model directory (no config.json)"),
        (lambda: load_pretrained(tmp_path / "nowhere"), "model.init_from="),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
