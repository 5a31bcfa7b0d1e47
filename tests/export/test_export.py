"""`diffllm export` on real tiny trained checkpoints of every layout: the exported model's logits in transformers
equal ours, transformers' greedy `generate()` equals our greedy decoding token for token, the tokenizer round-trips
text, and skipping the DiffLlama head permutation or the subln fold breaks the logits. Every registered variant has
a layout here (a new variant without one fails `test_every_registered_variant_has_a_layout`)."""

from __future__ import annotations

import json

import pytest
import torch

from diffllm.export import diffllama
from diffllm.export.hf import export_run
from diffllm.model import variants
from diffllm.runs import Run
from tests.export.helpers import LAYOUTS, TEXT, greedy

transformers = pytest.importorskip("transformers")
LAYOUT_NAMES = list(LAYOUTS)


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """(layout, format) -> (export result, our model, our tokenizer, HF model), made on first use."""
    made = {}

    def get(layout: str, fmt: str):
        if (layout, fmt) not in made:
            out = tmp_path_factory.mktemp(f"{layout}-{fmt}")
            done = export_run(runs[layout], out, format=fmt)
            _, ours, tok = Run(runs[layout]).model()
            hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=done.format == "remote")
            made[layout, fmt] = (done, ours, tok, hf.eval())
        return made[layout, fmt]

    return get


def layout_arch(overrides: list[str]) -> str:
    """The arch a layout trains: its preset's, or a later model.arch override."""
    from diffllm.model.presets import load_preset

    arch = load_preset(next(o.split("=", 1)[1] for o in overrides if o.startswith("model="))).arch
    return next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("model.arch=")), arch)


def test_every_registered_variant_has_a_layout():
    covered = {layout_arch(over) for over, _ in LAYOUTS.values()}
    assert set(variants()) <= covered, f"no export layout for {sorted(set(variants()) - covered)} in helpers.LAYOUTS"


@pytest.mark.parametrize("arch", list(variants()))
def test_the_remote_bundle_ships_the_variants_own_equations(arch):
    """One definition of each variant's equations: the bundle's attention file holds the source of the very classes
    diffllm's forward runs (`AttentionVariant.equations()`), beside model/layers.py and documents.py verbatim, and
    nothing in it imports diffllm."""
    import inspect
    import re
    from pathlib import Path

    from diffllm.export.remote import bundle
    from diffllm.model import ModelConfig, documents, layers

    cfg = ModelConfig(arch=arch)
    files = bundle(cfg)
    attention = next(text for name, text in files.items() if name.startswith("diffllm_attention_"))
    classes = cfg.variant.equations()
    assert classes and all(inspect.getsource(c) in attention for c in classes)
    assert isinstance(cfg.variant(cfg, 0), classes[-1]) and attention.rstrip().endswith(f"= {classes[-1].__name__}")
    assert {Path(layers.__file__).read_text(), Path(documents.__file__).read_text()} <= set(files.values())
    assert not any(re.search(r"^\s*(from|import)\s+diffllm\b", text, re.M) for text in files.values())


def max_logit_diff(ours, hf, ids: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        want, got = ours(ids), hf(ids).logits
    return (got - want).abs().max().item(), want.std().item()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["auto", "remote"])
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_logits_equal_ours(exported, layout, fmt):
    done, ours, tok, hf = exported(layout, fmt)
    assert done.format == (LAYOUTS[layout][1] if fmt == "auto" else "remote")
    ids = torch.tensor([tok.encode(TEXT)])  # (1, T) real text
    diff, spread = max_logit_diff(ours, hf, ids)
    assert diff <= 1e-5 and spread > 0.1, (diff, spread)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["auto", "remote"])
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_greedy_generate_equals_ours(exported, layout, fmt):
    done, ours, tok, hf = exported(layout, fmt)
    prompt = tok.encode("ROMEO: But soft, what light")
    got = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
    assert got == greedy(ours, prompt, 16, tok.eos_id)
    assert len(got) > len(prompt)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["llama-interleaved-gqa", "diff-layernorm-partial"])
def test_tokenizer_round_trips(exported, layout):
    done, _, tok, _ = exported(layout, "auto")
    hf_tok = transformers.AutoTokenizer.from_pretrained(done.out)
    for text in (TEXT, "  odd   spacing\tand unicode: café ☃\n\n", "a literal <|endoftext|> stays text"):
        ids = hf_tok(text)["input_ids"]
        assert ids == tok.encode(text)  # no BOS added, same ids as training
        assert hf_tok.decode(ids) == text == tok.decode(ids)
    assert hf_tok.eos_token_id == tok.eos_id == hf_tok.bos_token_id
    gen = json.loads((done.out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_id


@pytest.mark.slow
@pytest.mark.parametrize("skip", ["pair_heads", "fold_subln"])
def test_skipping_a_diffllama_step_breaks_the_logits(runs, skip):
    """The negative control: the same trained GQA Diff run through DiffLlama without one step of the recipe."""
    cfg, ours, tok = Run(runs["diff-interleaved-gqa"]).model()
    hf = transformers.DiffLlamaForCausalLM(diffllama.hf_config(cfg)).eval()
    hf.load_state_dict(diffllama.to_hf(cfg, ours.state_dict(), **{skip: False}), strict=False)
    diff, _ = max_logit_diff(ours, hf, torch.tensor([tok.encode(TEXT)]))
    assert diff > 1e-3, diff
    hf.load_state_dict(diffllama.to_hf(cfg, ours.state_dict()), strict=False)  # and the full recipe restores them
    assert max_logit_diff(ours, hf, torch.tensor([tok.encode(TEXT)]))[0] <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
def test_remote_code_batches_padded_prompts(exported, side):
    """Padding as lm-eval and batched generation use it: every row equals our model on that row alone."""
    done, ours, tok, hf = exported("diff-layernorm-partial", "auto")
    hf_tok = transformers.AutoTokenizer.from_pretrained(done.out, padding_side=side)
    texts = ["ROMEO: But soft", "JULIET: O Romeo, Romeo! wherefore art thou"]
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    width = batch["input_ids"].shape[1]
    if side == "right":  # scoring: the logits of the real tokens
        with torch.no_grad():
            logits = hf(**batch).logits
        for row, text in enumerate(texts):
            ids = tok.encode(text)
            diff = (logits[row, : len(ids)] - ours(torch.tensor([ids]))[0]).abs().max().item()
            assert diff <= 1e-5, (row, diff)
    else:  # generation
        out = hf.generate(**batch, max_new_tokens=8, do_sample=False)
        for row, text in enumerate(texts):
            ids = tok.encode(text)
            want = greedy(ours, ids, 8, tok.eos_id)[len(ids) :]
            assert out[row, width : width + len(want)].tolist() == want


@pytest.mark.slow
def test_model_card_states_the_run(exported, runs):
    done, _, _, _ = exported("stablelm", "auto")
    card = (done.out / "README.md").read_text()
    summary = json.loads((runs["stablelm"] / "summary.json").read_text())
    assert f"| final validation loss | {summary['final_val_loss']:.4f} |" in card
    assert "| tokens trained | 1,536 (step 6) |" in card and "| preset | transformer-tiny |" in card
    assert "StableLmForCausalLM" in card and "norm: layernorm" in card  # the run's config


@pytest.mark.slow
def test_bfloat16_export_holds_our_weights_rounded(runs, tmp_path):
    """dtype=bfloat16 rounds after the conversion: for Llama (a pure permutation) the HF model equals ours with
    bf16-rounded weights."""
    from safetensors.torch import load_file

    done = export_run(runs["llama-interleaved-gqa"], tmp_path / "hf", dtype="bfloat16")
    assert {t.dtype for t in load_file(str(done.out / "model.safetensors")).values()} == {torch.bfloat16}
    hf = transformers.AutoModelForCausalLM.from_pretrained(done.out, dtype=torch.float32).eval()
    _, ours, tok = Run(runs["llama-interleaved-gqa"]).model()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    assert max_logit_diff(ours, hf, torch.tensor([tok.encode(TEXT)]))[0] <= 1e-5


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_remote_exports_of_two_variants_in_one_process_keep_their_own_attention(runs, tmp_path):
    """transformers re-executes a changed modeling file but takes the modules it imports from sys.modules by name:
    two remote exports in folders of the same name (here `hf`), loaded one after the other, must each run their own
    variant's attention (before the bundle's module names carried a digest, the second ran the first's)."""
    for layout in ("diff2", "diff-layernorm-partial", "llama-interleaved-gqa"):
        out = tmp_path / layout / "hf"
        out.mkdir(parents=True)
        export_run(runs[layout], out, format="remote")
        _, ours, tok = Run(runs[layout]).model()
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
        diff, scale = max_logit_diff(ours, hf, torch.tensor([tok.encode(TEXT)[:48]]))
        assert diff <= 1e-4 * max(scale, 1.0), (layout, diff)
