"""Diff diagnostics (diffllm/train/diagnostics.py): per-layer lambda, Diff V2's mean gate and the attention-output RMS
against float64 references on a model, and in real runs against the model loaded from the final checkpoint."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from diffllm.model import DecoderLM, ModelConfig
from diffllm.model.layers import rotary_cos_sin
from diffllm.runs import Run, read_metrics
from diffllm.train.diagnostics import Diagnostics, DiagnosticsHook
from tests.distributed import run_train
from tests.train.helpers import make_view, tiny


def tiny_model(arch: str) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(ModelConfig(arch=arch, d_model=32, n_layers=3, n_heads=4, vocab_size=100, max_seq_len=16))


@torch.no_grad()
def reference(model: DecoderLM, tokens: torch.Tensor) -> dict[str, float]:
    """Each block's attention output in float64, by hand (no hooks): its RMS, and Diff V2's mean sigmoid gate."""
    m = copy.deepcopy(model).double()
    x = m.tok_embeddings(tokens)
    cos, sin = rotary_cos_sin(tokens.shape[1], m.cfg.rotary_dim, m.cfg.rope_theta, x.device, x.dtype)
    out = {}
    for i, block in enumerate(m.layers):
        h = block.attn_norm(x)
        a = block.attn(h, cos, sin)
        out[f"attn_rms/{i}"] = math.sqrt(float((a * a).sum()) / a.numel())
        if hasattr(block.attn, "lambda_proj"):
            out[f"lambda_mean/{i}"] = float(torch.sigmoid(h @ block.attn.lambda_proj.weight.T).mean())
        x = x + a
        x = x + block.mlp(block.mlp_norm(x))
    return out


def two_armed_micro_batches(arch: str) -> tuple[DecoderLM, Diagnostics, list[torch.Tensor]]:
    """A tiny model in training mode whose Diagnostics were armed for two micro-batches' forward and backward."""
    model = tiny_model(arch).train()
    diag = Diagnostics(model, say=lambda msg, error=False: None)
    batches = [torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    diag.arm()
    for b in batches:
        model(b).float().pow(2).mean().backward()
    return model, diag, batches


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2"])
def test_forward_values_are_the_mean_over_micro_batches_of_the_float64_reference(arch):
    """Two training micro-batches are kept (an eval forward under no_grad is not); the hooks come off after."""
    model, diag, batches = two_armed_micro_batches(arch)
    model.eval()
    with torch.no_grad():
        model(torch.randint(0, 100, (2, 12)))  # a validation forward: not counted
    model.train()
    got = diag.collect(step=1)
    refs = [reference(model, b) for b in batches]
    want = {k: (refs[0][k] + refs[1][k]) / 2 for k in refs[0]}
    forward_keys = {k for k in got if k.startswith(("attn_rms/", "lambda_mean/"))}
    assert forward_keys == set(want)
    assert ("lambda_mean/0" in want) == (arch == "diff2")
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-5), k
    assert all(not block.attn._forward_hooks for block in model.layers)  # disarmed: later steps pay nothing
    model(batches[0]).sum().backward()
    assert not any(k.startswith("attn_rms/") for k in diag.collect(step=2))


def test_the_diagnostics_hook_arms_only_the_logged_steps(tmp_path):
    """log_every=2 over 3 steps: the records of steps 2 and 3 hold the RMS of their own forwards only (step 1's is not
    mixed in), a step that is not logged runs without hooks and adds nothing, and the hooks come off at the end."""
    model = tiny_model("diff2").train()
    view = make_view(tmp_path, steps=3, model=SimpleNamespace(module=model))  # the accessor gives the engine
    hook = DiagnosticsHook(log_every=2)
    hook.on_start(view)
    batches = {s: torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3)}
    records = {}
    for step, batch in batches.items():
        assert bool(model.layers[0].attn._forward_hooks) == (step != 1)
        model(batch).sum().backward()
        view.state.step = step
        records[step] = hook.on_step_end(view, {"step": step, "skipped": False})
    assert records[1] is None
    for step in (2, 3):
        for k, v in reference(model, batches[step]).items():  # the weights did not change between the steps
            assert records[step][k] == pytest.approx(v, rel=1e-5), (step, k)
    assert not model.layers[0].attn._forward_hooks


def test_lambda_per_layer_min_and_a_warning_once_per_negative_layer():
    model = tiny_model("diff")
    warnings = []
    diag = Diagnostics(model, say=lambda msg, error=False: warnings.append((msg, error)))
    with torch.no_grad():  # layer 1: exp(0) - exp(d * 0.25) + lambda_init < 0
        attn = model.layers[1].attn
        attn.lambda_q1.zero_(), attn.lambda_k1.zero_(), attn.lambda_q2.fill_(0.5), attn.lambda_k2.fill_(0.5)
    for step in (1, 2):
        rec = diag.collect(step)
        with torch.no_grad():
            want = [float(block.attn.lambda_full()) for block in model.layers]
        assert [rec[f"lambda/{i}"] for i in range(3)] == want
        assert rec["lambda_min"] == min(want) == want[1] < 0
    assert len(warnings) == 1 and warnings[0][1] is True
    assert warnings[0][0].startswith("warning: layer 1: lambda = ") and "< 0" in warnings[0][0]
    assert warnings[0][0].endswith("at step 1")
    assert "lambda/0" not in Diagnostics(tiny_model("transformer"), print).collect(1)


@pytest.mark.slow
def test_a_zero3_diff_run_logs_the_lambda_of_its_final_checkpoint(tokenizer, tmp_path):
    """2 ranks, ZeRO-3 with every parameter partitioned (lambda is gathered to be read), activation checkpointing
    (hooks called again in the recomputation), grad-accum 2, log_every 2 over 5 steps: records at steps 2, 4, 5 carry
    lambda and attn_rms for every layer; the last record's lambda is lambda_full() of the final checkpoint's model."""
    run_dir = tmp_path / "run"
    no_persistence = "+trainer.deepspeed.zero_optimization.stage3_param_persistence_threshold=0"  # lambda partitioned
    run = run_train(
        tiny(run_dir, 3, "trainer.tokens=5120", "trainer.log_every=2", no_persistence), 2, tmp_path / "logs"
    )
    records = [r for r in read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == [2, 4, 5]
    for r in records:
        assert {"lambda/0", "lambda/1", "lambda_min", "attn_rms/0", "attn_rms/1"} <= set(r)
        assert r["lambda_min"] == min(r["lambda/0"], r["lambda/1"])
        assert all(r[f"attn_rms/{i}"] > 0 for i in (0, 1))
    _, model, _ = Run(run_dir).model(tokenizer=False)
    for i, block in enumerate(model.layers):
        with torch.no_grad():
            assert records[-1][f"lambda/{i}"] == pytest.approx(float(block.attn.lambda_full()), rel=1e-6, abs=1e-7)
    assert f"λmin {records[-1]['lambda_min']:.3f}" in run.output(0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "diff2"])
def test_other_archs_log_attn_rms_and_no_lambda(tokenizer, tmp_path, arch):
    run_dir = tmp_path / "run"
    run_train(
        tiny(run_dir, 2, f"model={arch}-tiny", "model.d_model=64", "model.n_layers=2", "trainer.tokens=2048"),
        1,
        tmp_path / "logs",
        launcher="plain",
    )
    records = [r for r in read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert {"attn_rms/0", "attn_rms/1"} <= set(r) and "lambda_min" not in r and "lambda/0" not in r
        assert ({"lambda_mean/0", "lambda_mean/1"} <= set(r)) == (arch == "diff2")


@pytest.mark.slow  # the first torch.compile import takes ~10 s
def test_compiled_blocks_are_not_hooked_and_say_so_once():
    model = tiny_model("diff")
    for block in model.layers:
        block.compile()  # compiles lazily, at the first forward: nothing runs here
    notes = []
    diag = Diagnostics(model, say=lambda msg, error=False: notes.append(msg))
    diag.arm(), diag.arm()
    assert not diag.armed and not any(block.attn._forward_hooks for block in model.layers)
    assert len(notes) == 1 and "trainer.compile=true" in notes[0]
    assert set(diag.collect(1)) == {"lambda/0", "lambda/1", "lambda/2", "lambda_min"}


def key_head(arch: str, j: int, n_q: int, n_k: int) -> int:
    """The key (sub-)head that query (sub-)head j reads: GQA's j // (n_q/n_k); Diff: diff head j // 2 of h = n_q/2
    reads group g = (j // 2) // (h / (n_k/2)), its component j % 2 (sub-heads 2g, 2g+1)."""
    if arch == "diff":
        return 2 * ((j // 2) // (n_q // n_k)) + j % 2
    return j // (n_q // n_k)


@torch.no_grad()
def stability_reference(model: DecoderLM, tokens: torch.Tensor, docs=None) -> dict[str, float]:
    """In float64, by hand: each block output's largest |value|, and each layer's largest |q k^T / sqrt(d)| over the
    causal positions (with `docs`, a Documents of one row: within each document) of every softmax map (Diff: both),
    the heads paired as each paper pairs them."""
    from diffllm.model.layers import apply_rotary

    m = copy.deepcopy(model).double()
    x = m.tok_embeddings(tokens)
    B, T, d = *tokens.shape, m.cfg.head_dim
    cos, sin = rotary_cos_sin(T, m.cfg.rotary_dim, m.cfg.rope_theta, x.device, x.dtype)
    out = {}
    for i, block in enumerate(m.layers):
        h, a = block.attn_norm(x), block.attn
        q = apply_rotary(a.q_proj(h).view(B, T, -1, d), cos, sin, a.interleaved)  # (B, T, Hq, d)
        k = apply_rotary(a.k_proj(h).view(B, T, -1, d), cos, sin, a.interleaved)  # (B, T, Hk, d)
        causal = torch.ones(T, T, dtype=torch.bool).tril() if docs is None else docs.mask[0, 0]
        out[f"attn_logit_max/{i}"] = max(
            float(
                (q[:, :, j] @ k[:, :, key_head(m.cfg.arch, j, q.shape[2], k.shape[2])].transpose(1, 2) / math.sqrt(d))
                .abs()[:, causal]
                .max()
            )
            for j in range(q.shape[2])
        )
        x = x + a(h, cos, sin, docs=docs)
        x = x + block.mlp(block.mlp_norm(x))
        out[f"act_max/{i}"] = float(x.abs().max())
    return out


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2"])
def test_stability_telemetry_against_float64(arch):
    """act_max: the max over both micro-batches; attn_logit_max: the first micro-batch's, against attention written
    out by hand; grad_norm/<i>: each block's gradient norm, kept before the update."""
    model, diag, batches = two_armed_micro_batches(arch)
    diag.keep_grad_norms()
    got = diag.collect(step=1)
    refs = [stability_reference(model, b) for b in batches]
    for i in range(3):
        assert got[f"act_max/{i}"] == pytest.approx(max(r[f"act_max/{i}"] for r in refs), rel=1e-5)
        grads = [p.grad.double() for p in model.layers[i].parameters() if p.grad is not None]
        assert got[f"grad_norm/{i}"] == pytest.approx(math.sqrt(sum(float((g * g).sum()) for g in grads)), rel=1e-6)
        assert got[f"attn_logit_max/{i}"] == pytest.approx(refs[0][f"attn_logit_max/{i}"], rel=1e-5)
    assert all(not block._forward_hooks and not block.attn._forward_hooks for block in model.layers)


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_attn_logit_max_counts_only_the_logits_within_each_document(arch):
    """A forward with document masks (two documents in one row) takes the max over the positions each query attends
    to: causal and within its own document, not across the boundary."""
    from diffllm.model.documents import Documents

    model = tiny_model(arch).train()
    diag = Diagnostics(model, say=lambda msg, error=False: None)
    tokens = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[0] * 5 + [1] * 7])
    diag.arm()
    model(tokens, doc_ids=ids).float().pow(2).mean().backward()
    got = diag.collect(step=1)
    within, plain = stability_reference(model, tokens, Documents(ids)), stability_reference(model, tokens)
    assert any(plain[f"attn_logit_max/{i}"] > within[f"attn_logit_max/{i}"] for i in range(3))  # the test can fail
    for i in range(3):
        assert got[f"attn_logit_max/{i}"] == pytest.approx(within[f"attn_logit_max/{i}"], rel=1e-5), i


# ----- trainer.diagnostics=cheap --------------------------------------------------------------------------------------
def cheap_step(arch: str, layers: int = 3):
    """A tiny model whose CheapDiagnostics were armed for two micro-batches (forward and backward) and kept the
    block gradients before an update: (model, diagnostics, batches, gradients, counts of the collect)."""
    from diffllm.train.diagnostics import CheapDiagnostics
    from tests.train.counting import Counter

    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, d_model=32, n_layers=layers, n_heads=4, vocab_size=100, max_seq_len=16)
    model = DecoderLM(cfg).train()
    diag = CheapDiagnostics(model, say=lambda msg, error=False: None)
    batches = [torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    diag.arm()
    for b in batches:
        model(b).float().pow(2).mean().backward()
    diag.keep_grad_norms()
    grads = {i: [p.grad.double() for p in block.parameters()] for i, block in enumerate(model.layers)}
    with torch.no_grad():  # an update: cheap reads the weights after it
        for p in model.parameters():
            p.sub_(0.01 * p.grad)
    with Counter() as counter:
        counter.start(1)
        got = diag.collect(step=1)
        counter.stop()
    return model, got, batches, grads, counter.steps[1]


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2"])
def test_cheap_values_against_float64_and_one_readback(arch):
    """cheap on one process (every tensor whole): grad_norm/<i> before the update and weight_norm/<i> after it against
    float64 norms, the reports (computed on the host from the parameters read back) equal to the model's own; the
    collect reads back once and syncs nowhere else."""
    model, got, batches, grads, count = cheap_step(arch)
    for i, block in enumerate(model.layers):
        assert got[f"grad_norm/{i}"] == pytest.approx(math.sqrt(sum(float((g * g).sum()) for g in grads[i])), rel=1e-6)
        weights = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in block.parameters()))
        assert got[f"weight_norm/{i}"] == pytest.approx(weights, rel=1e-6)
    assert count.syncs == 1 and count.sites() == {f"diffllm sync:cpu {count.events[0].site}": 1}, count.sites()
    with torch.no_grad():
        want = dict(Diagnostics(model, print).report_record(1))  # full's reports, read from the model itself
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("arch", ["transformer", "diff2"])
def test_cheap_forward_values_equal_full_on_the_same_forwards(arch):
    """The forward-side values (weights unchanged between the two forwards): act_max and attn_logit_max of the first
    sequence (batch 1: the whole micro-batch), attn_rms and the probes, as full computes them."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, d_model=32, n_layers=2, n_heads=4, vocab_size=100, max_seq_len=16)
    model = DecoderLM(cfg).train()
    from diffllm.train.diagnostics import CheapDiagnostics

    batches = [torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    out = []
    for diag in (Diagnostics(model, print), CheapDiagnostics(model, print)):
        diag.arm()
        for b in batches:
            model(b).float().pow(2).mean().backward()
        out.append(diag.collect(step=1))
    full, cheap = out
    for key, value in full.items():
        assert cheap[key] == pytest.approx(value, rel=1e-6), key


def test_cheap_samples_the_logits_of_a_prefix(monkeypatch):
    """attn_logit_max at cheap: the first LOGIT_SAMPLE positions of the first sequence of the step's first
    micro-batch, the causal logits of that prefix exactly (they do not depend on the tokens after it)."""
    import diffllm.train.diagnostics as diagnostics

    monkeypatch.setattr(diagnostics, "LOGIT_SAMPLE", 5)
    model = tiny_model("diff").train()
    diag = diagnostics.CheapDiagnostics(model, print)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(4))
    diag.arm()
    model(tokens).float().pow(2).mean().backward()
    got = diag.collect(step=1)
    prefix = stability_reference(model, tokens[:1, :5])
    for i in range(3):
        assert got[f"attn_logit_max/{i}"] == pytest.approx(prefix[f"attn_logit_max/{i}"], rel=1e-5), i


def test_cheap_collect_syncs_once_at_any_depth():
    """One readback per logged step whatever the depth (3 or 6 layers), and no sync during the armed forwards."""
    from tests.train.counting import Counter

    for layers in (3, 6):
        torch.manual_seed(0)
        model = DecoderLM(ModelConfig(arch="diff", d_model=32, n_layers=layers, n_heads=4, vocab_size=100))
        from diffllm.train.diagnostics import CheapDiagnostics

        diag = CheapDiagnostics(model.train(), print)
        diag.arm()
        with Counter() as counter:
            counter.start(1)
            model(torch.randint(0, 100, (2, 12))).float().pow(2).mean().backward()
            diag.keep_grad_norms()
            rec = diag.collect(step=1)
            counter.stop()
        assert counter.steps[1].syncs == 1 and f"grad_norm/{layers - 1}" in rec and f"lambda/{layers - 1}" in rec
