"""The chunked loss head (diffllm/model/loss.py) against the unchunked one (`full_loss`, the loss as it always was):
the same loss and the same gradient of every parameter within fp32 rounding for every arch, with and without a loss
mask, both reductions, float64, mup's readout scale and tied embeddings; its saved-for-backward bytes at vocab 50K,
seq 2048, micro-batch 8 counted on the meta device; one compiled graph; and under ZeRO-3 the same training losses."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from diffllm.model import DecoderLM, ModelConfig
from diffllm.model import loss as loss_head
from diffllm.model.presets import load_preset
from diffllm.scaling.activations import _saved_bytes
from tests.distributed import REPO, run_distributed

ARCHS = ("transformer", "diff", "diff2", "mla")
B, T = 2, 24  # 48 tokens: chunks of 5 (10 chunks, the last of 3 tokens)
SMALL = 5  # tokens per chunk when a test forces chunks


def tokens(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g), torch.randint(0, vocab, (B, T), generator=g), g


def loss_and_grads(model: DecoderLM, chunk: int, masks, reductions=("mean", "sum")) -> list:
    """[(loss, {name: grad})] for each mask x reduction, with `chunk` tokens per chunk (0: the unchunked loss)."""
    inputs, targets, _ = tokens(model.cfg.padded_vocab_size)
    width = torch.promote_types(next(model.parameters()).dtype, torch.float32).itemsize
    limit = chunk * model.cfg.padded_vocab_size * width if chunk else 2**62  # CHUNK_BYTES that cuts `chunk` tokens
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loss_head, "CHUNK_BYTES", limit)
        for mask in masks:
            for reduction in reductions:
                model.zero_grad(set_to_none=True)
                loss = model(inputs, targets=targets, target_mask=mask, reduction=reduction)
                loss.backward()
                out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return out


# (loss, gradients, Diff's lambdas) relative tolerances. Measured, float32, 4 archs + mup + tied: losses <= 2.3e-7,
# gradients <= 7.4e-7, lambdas <= 7.4e-6 (4.8e-5 with 2 layers); float64: 2.8e-16, 7.7e-16, 2.1e-15.
FP32 = (1e-6, 5e-6, 1e-4)
FP64 = (1e-14, 1e-12, 1e-12)


def assert_equal_within(model: DecoderLM, got: list, want: list, tols: tuple[float, float, float]) -> None:
    """Each loss within tols[0] of the reference, relative to it; each gradient within tols[1] of the reference,
    relative to that tensor's largest element; tols[2] for Diff's lambdas (model.no_decay_parameters), whose
    gradients are sums over every token that cancel to ~1e-3 of their terms (in fp32 the unchunked loss is 3e-5 from
    float64 there too: rounding, not a lost term)."""
    loose = {id(p) for p in model.no_decay_parameters()}
    for (loss, grads), (ref_loss, ref_grads) in zip(got, want, strict=True):
        assert abs(float(loss - ref_loss)) <= tols[0] * abs(float(ref_loss)), (float(loss), float(ref_loss))
        for name, p in model.named_parameters():
            ref, tol = ref_grads[name], tols[2] if id(p) in loose else tols[1]
            assert float((grads[name] - ref).abs().max()) <= tol * float(ref.abs().max()), name


def tiny(arch: str, **kw) -> DecoderLM:
    """The arch's tiny preset, shrunk to 1 layer and vocab 512 (CPU time)."""
    torch.manual_seed(0)
    return DecoderLM(replace(load_preset(f"{arch}-tiny"), n_layers=1, vocab_size=512, **kw))


def masks(g: torch.Generator) -> list:
    return [None, torch.rand(B, T, generator=g) < 0.4]


@pytest.mark.parametrize("arch", ARCHS)
def test_chunks_give_the_unchunked_loss_and_gradients(arch):
    model = tiny(arch)
    mask_list = masks(tokens(512)[2])
    want = loss_and_grads(model, 0, mask_list)
    got = loss_and_grads(model, SMALL, mask_list)
    assert_equal_within(model, got, want, FP32)
    assert not torch.equal(got[0][0], want[0][0]) or any(  # the chunked ops did run (they round differently)
        not torch.equal(got[0][1][n], want[0][1][n]) for n in want[0][1]
    )


@pytest.mark.parametrize(
    "case",
    [
        "float64",
        "mup",  # readout_scale 1/4
        "tied",  # the head is the embedding table
    ],
)
def test_chunks_in_float64_under_mup_and_with_tied_embeddings(case):
    if case == "float64":
        model, tols = tiny("diff").double(), FP64
    elif case == "mup":
        torch.manual_seed(0)
        model = DecoderLM(
            ModelConfig(
                arch="diff", d_model=192, n_heads=24, n_layers=1, vocab_size=512, parametrization="mup", base_width=48
            )
        )
        assert model.readout_scale == 0.25
        tols = FP32
    else:
        model, tols = tiny("transformer", tie_embeddings=True), FP32
        assert model.lm_head.weight is model.tok_embeddings.weight
    mask_list = masks(tokens(model.cfg.padded_vocab_size)[2])
    assert_equal_within(model, loss_and_grads(model, SMALL, mask_list), loss_and_grads(model, 0, mask_list), tols)


def test_no_counted_target_gives_zero_loss_and_gradients_in_chunks():
    model = tiny("mla")
    for loss, grads in loss_and_grads(model, SMALL, [torch.zeros(B, T, dtype=torch.bool)]):
        assert float(loss) == 0.0 and all(float(g.abs().max()) == 0.0 for g in grads.values())


def test_the_chunk_rule():
    """One chunk (the unchunked ops, bit for bit) while the fp32 logits fit in CHUNK_BYTES; else the fewest equal
    chunks that fit."""
    limit = loss_head.CHUNK_BYTES
    assert loss_head.chunk_tokens(4 * 64, 1024) == 256  # the golden and resume runs' micro-batch: one chunk
    assert loss_head.chunk_tokens(8 * 512, 8192) == 8 * 512  # the CPU demo's (trainer=cpu, diff-tiny): one chunk
    for n, vocab in [(8 * 2048, 50304), (8 * 2048, 100288), (1 * 2048, 100288), (3 * 1000, 2**17)]:
        size = loss_head.chunk_tokens(n, vocab)
        chunks = math.ceil(n / size)
        assert size * vocab * 4 <= limit  # each chunk's fp32 logits fit
        assert chunks == math.ceil(n / (limit // (vocab * 4)))  # no fewer chunks would fit
        assert (chunks - 1) * size < n  # none empty
    assert loss_head.chunk_tokens(8 * 2048, 50304) == 1261  # 13 chunks (docs/training.md)
    assert loss_head.chunk_tokens(10, 2**40) == 1  # a vocab larger than the limit: one token per chunk
    with pytest.raises(ValueError, match="reduction"):
        loss_head.head_loss(
            torch.nn.Linear(4, 8), torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long), None, 1.0, "none"
        )


def test_saved_bytes_at_vocab_50k_are_under_a_quarter_of_the_full_logits():
    """Counted with saved-tensor hooks on the meta device (no memory): bf16 hidden states (B*T, E) of the 13.1B
    models (E 5120), vocab 50,304, seq 2048, micro-batch 8. The chunked head keeps the hidden states and the targets,
    nothing of the logits; the unchunked one also keeps the fp32 log-softmax (B*T, V)."""
    n, E, V = 8 * 2048, 5120, 50304
    with torch.device("meta"):
        head = torch.nn.Linear(E, V, bias=False).to(torch.bfloat16)
        hidden = torch.empty(8, 2048, E, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(8, 2048, dtype=torch.long)

    def count(loss) -> int:
        return _saved_bytes(lambda: loss(head, hidden * 1.0, targets), [head.weight])  # * 1.0: a norm's output

    full, chunked = count(loss_head.full_loss), count(loss_head.head_loss)
    assert full >= n * V * 4  # the fp32 log-softmax: 3.07 GiB
    assert chunked == n * E * 2 + n * 8  # the hidden states and the targets: 160 MiB
    assert chunked <= full / 4  # measured: 167,903,232 vs 3,464,626,176 bytes (1/20.6)


def test_a_chunked_head_compiles_into_one_graph():
    """torch.compile(fullgraph=True) of a DecoderLM forward with targets: no graph break, one activation-checkpoint
    region per chunk in the graph, and the eager chunked loss and gradients bit for bit."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(arch="transformer", d_model=32, n_layers=1, n_heads=2, vocab_size=256))
    inputs, targets, g = tokens(256)
    mask = torch.rand(B, T, generator=g) < 0.5
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    runs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loss_head, "CHUNK_BYTES", SMALL * 256 * 4)
        for forward in (compiled, model):
            model.zero_grad(set_to_none=True)
            loss = forward(inputs, targets=targets, target_mask=mask)
            loss.backward()
            runs.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    torch._dynamo.reset()
    [graph] = counter.graphs
    regions = [n for n in graph.graph.nodes if n.op == "call_function" and "checkpoint" in str(n.target)]
    assert counter.frame_count == 1 and len(regions) == math.ceil(B * T / SMALL)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def _zero3_losses(chunk_bytes: list[int]) -> list[dict]:
    """For each of `chunk_bytes` (the loss head cut by it): three ZeRO-3 training steps (fp32, blocks checkpointed as
    trainer.activation_checkpointing does) of a fresh tiny model on the same masked batches; the micro-batch losses
    and the head's calls in the last forward and backward."""
    import deepspeed

    from diffllm.train.dist import skip_shm_op

    skip_shm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    return [_zero3_run(limit) for limit in chunk_bytes]


def _zero3_run(chunk_bytes: int) -> dict:
    from diffllm.budget import plan_budget
    from diffllm.data.batch import Batch
    from diffllm.train.config import OptimConfig, TrainerConfig
    from diffllm.train.engine import build_engine, deepspeed_config
    from diffllm.train.loss import lm_loss
    from diffllm.train.optim import UpdateGate

    loss_head.CHUNK_BYTES = chunk_bytes
    trainer = TrainerConfig(
        zero_stage=3, micro_batch_size=2, global_batch_tokens=32, tokens=96, activation_checkpointing=True
    )
    opt = OptimConfig(lr=1e-2, warmup_steps=1, schedule="linear", min_lr=1e-3)
    budget = plan_budget(trainer, 8, 1)  # 3 steps of 2 micro-batches of 2 x 8 tokens
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, max_seq_len=8)
    engine, _ = build_engine(cfg, trainer, opt, deepspeed_config(trainer, opt, budget, "fp32"), 0, UpdateGate())
    calls = []
    engine.module.lm_head.register_forward_hook(lambda *_: calls.append(1))
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(budget.steps):
        for _ in range(2):
            batch = Batch(torch.randint(0, 64, (2, 9), generator=g), loss_mask=torch.rand(2, 9, generator=g) < 0.7)
            calls.clear()
            loss = lm_loss(engine, batch)
            forward_calls = len(calls)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
    return {"losses": losses, "head_calls": (forward_calls, len(calls))}


@pytest.mark.slow  # DeepSpeed's import and two ZeRO-3 engines in a fresh process
def test_zero3_training_losses_are_the_unchunked_ones():
    [[ref, got]] = run_distributed(_zero3_losses, world_size=1, args=([2**62, 3 * 64 * 4],))  # 1 chunk; 3 tokens each
    assert ref["head_calls"] == (1, 1) and got["head_calls"] == (6, 12)  # each chunk gathered again to recompute
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-6), (got["losses"], ref["losses"])  # measured: 1.2e-7


def _liger_check() -> dict:
    """Liger's fused loss (`_liger_loss`) against the chunked torch loss, fp32, a third of the targets masked, readout
    scales 1 and 1/4: the largest differences of the loss and of the hidden states' and weight's gradients."""
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 300, bias=False)
    h, t = torch.randn(40, 32), torch.randint(0, 300, (40,))
    t[::3] = loss_head.IGNORE
    worst = {"loss": 0.0, "hidden": 0.0, "weight": 0.0}
    for scale in (1.0, 0.25):
        runs = []
        for fused in (False, True):
            x = h.clone().requires_grad_()
            head.zero_grad()
            loss = loss_head._liger_loss(head, x, t, scale) if fused else loss_head._chunked_sum(head, x, t, scale, 7)
            loss.backward()
            runs.append((loss.detach(), x.grad, head.weight.grad.clone()))
        (a, *ga), (b, *gb) = runs
        worst["loss"] = max(worst["loss"], float((a - b).abs() / a.abs()))
        for key, x, y in zip(("hidden", "weight"), ga, gb):
            worst[key] = max(worst[key], float((x - y).abs().max() / x.abs().max()))
    return worst


def test_liger_fused_kernel_gives_the_chunked_loss():
    """Where Liger-Kernel is installed (the GPU loss head's fused kernel; never required): its kernels in triton's
    interpreter on the CPU (TRITON_INTERPRET=1, read when they are defined: a fresh process) give the torch path's
    loss and gradients."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (optional: the GPU loss head's kernel)")
    code = "from tests.model.test_loss_head import _liger_check; print(_liger_check())"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worst = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert worst["loss"] <= 1e-6 and worst["hidden"] <= 1e-5 and worst["weight"] <= 1e-5, worst
