"""The Triton fused Diff attention (forward and all gradients) against an independent float64 eager implementation.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set by importing the module), which is
slow: the shapes are small. On a GPU the same tests run the compiled kernels.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported anywhere below
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]' brings it)")

from diffllm.model import DecoderLM, ModelConfig  # noqa: E402
from diffllm.model.config import BACKENDS  # noqa: E402
from diffllm.model.documents import Documents  # noqa: E402
from diffllm.model.triton_diff import INTERPRET, fused_diff_attention  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"


def reference(q, k, v, lam, allowed=None):
    """Float64 eager path, one diff head at a time with materialised maps: head i reads kv group i // (h/g).
    allowed: (B, T, T) bool, True where a query may see a key (default: causal, (T, T))."""
    B, h2, T, d = q.shape
    h, g = h2 // 2, k.shape[1] // 2
    q, k, v, lam = q.double(), k.double(), v.double(), lam.double()
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1) if allowed is None else ~allowed

    def softmax_map(qs, ks):  # (B, T, d) x (B, T, d) -> (B, T, T)
        return (qs @ ks.transpose(-1, -2) / math.sqrt(d)).masked_fill(future, -math.inf).softmax(-1)

    heads = []
    for i in range(h):
        j = i // (h // g)
        attn = softmax_map(q[:, i], k[:, j]) - lam * softmax_map(q[:, h + i], k[:, g + j])
        heads.append(attn @ v[:, j])  # (B, T, 2d)
    return torch.stack(heads, dim=1)  # (B, h, T, 2d)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def inputs(B, h, g, T, d, lam, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(B, 2 * h, T, d, dtype=dtype, device=DEVICE, requires_grad=True)
    k = torch.randn(B, 2 * g, T, d, dtype=dtype, device=DEVICE, requires_grad=True)
    v = torch.randn(B, g, T, 2 * d, dtype=dtype, device=DEVICE, requires_grad=True)
    return q, k, v, torch.tensor(lam, dtype=torch.float32, device=DEVICE, requires_grad=True)


# Interpreter tiles are 32 queries x 16 keys: every T below leaves a partial tail block.
CASES = [  # B, h, g, T, d, lam
    (1, 2, 2, 33, 16, 0.8),  # MHA
    (2, 4, 2, 40, 32, -0.45),  # GQA, 2 diff heads per kv group, negative lambda
    (1, 2, 1, 19, 80, 1.7),  # GQA, d = 80 padded to 128 (v: 160 -> 256), T below one query block
    (1, 4, 1, 21, 16, 0.0),  # GQA, 4 diff heads per kv group, lambda = 0
]


@pytest.mark.parametrize("B,h,g,T,d,lam", CASES)
def test_forward_and_gradients_match_float64_eager(B, h, g, T, d, lam):
    q, k, v, lam_t = inputs(B, h, g, T, d, lam)
    out = fused_diff_attention(q, k, v, lam_t)
    assert out.shape == (B, h, T, 2 * d) and out.dtype == torch.float32
    want = reference(q, k, v, lam_t)
    assert rel_err(out, want) <= 1e-5
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, lam_t), grad_out)
    wants = torch.autograd.grad(want, (q, k, v, lam_t), grad_out.double())
    for name, a, b in zip(("q", "k", "v", "lam"), got, wants):
        assert a.shape == b.shape, name
        assert rel_err(a, b) <= 1e-5, f"d{name}: {rel_err(a, b):.2e}"


def block_diagonal_causal(splits) -> torch.Tensor:
    """(B, T, T) bool by hand: query i sees key j iff j <= i and both lie in the same document of its row."""
    rows = []
    for lengths in splits:
        T = sum(lengths)
        allowed = torch.zeros(T, T, dtype=torch.bool)
        start = 0
        for n in lengths:
            allowed[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
            start += n
        rows.append(allowed)
    return torch.stack(rows).to(DEVICE)


def test_documents_skip_tiles_and_match_float64_eager():
    """T = 40 with the interpreter's 32-query x 16-key tiles. Row 0 (documents 10, 12, 18): query block 1 starts its
    key loop at tile 1 (row 32's document starts at 22); key tile 0's dK/dV loop stops before query block 1 (key 15's
    document ends at 22); rows 22..31 see nothing of key tile 0 (their running max is still -inf there). Row 1
    (20, 1, 19): a one-token document."""
    splits = [(10, 12, 18), (20, 1, 19)]
    ids = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in splits], device=DEVICE)
    q, k, v, lam = inputs(2, 4, 2, 40, 16, 0.6)
    out = fused_diff_attention(q, k, v, lam, Documents(ids))
    want = reference(q, k, v, lam, allowed=block_diagonal_causal(splits))
    assert rel_err(out, want) <= 1e-5
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, lam), grad_out)
    wants = torch.autograd.grad(want, (q, k, v, lam), grad_out.double())
    for name, a, b in zip(("q", "k", "v", "lam"), got, wants):
        assert rel_err(a, b) <= 1e-5, f"d{name}: {rel_err(a, b):.2e}"


def test_one_document_equals_no_documents_bit_for_bit():
    """The DOCS kernels with a single document read the same keys as the plain ones: equal outputs and gradients."""
    q, k, v, lam = inputs(1, 2, 1, 37, 16, -0.3)
    out = fused_diff_attention(q, k, v, lam)
    one = fused_diff_attention(q, k, v, lam, Documents(torch.zeros(1, 37, dtype=torch.long, device=DEVICE)))
    assert torch.equal(out, one)
    grad_out = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v, lam), grad_out), torch.autograd.grad(one, (q, k, v, lam), grad_out)
    ):
        assert torch.equal(a, b)


def test_forward_without_grad_matches():
    """The inference launch (no grad: nothing saved for a backward) gives the same output."""
    q, k, v, lam = inputs(1, 2, 1, 18, 16, -1.1)
    with torch.no_grad():
        out = fused_diff_attention(q, k, v, lam)
    assert rel_err(out, reference(q, k, v, lam)) <= 1e-5


def test_fp16_inputs_accumulate_in_fp32():
    """fp16 in and out; the error is that of fp16 rounding of the inputs to the matmuls, not of an fp16 softmax.
    (bf16 is checked on a GPU only: Triton 3.9's interpreter computes bf16 tl.dot wrongly.)"""
    q, k, v, lam = inputs(1, 2, 1, 20, 16, 0.5, dtype=torch.float16)
    out = fused_diff_attention(q, k, v, lam)
    assert out.dtype == torch.float16
    want = reference(q, k, v, lam)
    assert rel_err(out, want) <= 3e-3
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, lam), grad_out)
    wants = torch.autograd.grad(want, (q, k, v, lam), grad_out.double())
    assert got[3].dtype == torch.float32
    assert max(rel_err(a, b) for a, b in zip(got, wants)) <= 1e-2


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((1, 3, 8, 16), (1, 2, 8, 16), (1, 1, 8, 32)), "want q"),  # odd query head count
        (((1, 4, 8, 16), (1, 2, 8, 16), (1, 1, 8, 16)), "want q"),  # v not 2d wide
        (((1, 4, 8, 16), (1, 2, 9, 16), (1, 1, 9, 32)), "want q"),  # T differs
    ],
)
def test_bad_shapes_give_one_line_errors(shapes, match):
    q, k, v = (torch.zeros(s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=match) as err:
        fused_diff_attention(q, k, v, torch.tensor(0.5, device=DEVICE))
    assert "\n" not in str(err.value)


def test_bad_lambda_and_dtype():
    q, k, v, _ = inputs(1, 2, 1, 8, 16, 0.5)
    with pytest.raises(ValueError, match="lam must be a scalar"):
        fused_diff_attention(q, k, v, torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="one dtype"):
        fused_diff_attention(q, k.double(), v, torch.tensor(0.5, device=DEVICE))


@pytest.mark.slow
def test_diff_tiny_trains_like_sdpa():
    """Whole model: three AdamW steps of diff-tiny on one batch give the same losses with attn_backend=triton as with
    sdpa (the module skips without the triton package; without CUDA it runs in Triton's interpreter)."""
    assert "triton" in BACKENDS
    from dataclasses import asdict

    from diffllm.model.presets import load_preset

    preset = asdict(load_preset("diff-tiny"))
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    losses = {}
    for backend in ("sdpa", "triton"):
        torch.manual_seed(0)
        model = DecoderLM(ModelConfig(**{**preset, "vocab_size": 256, "max_seq_len": 32, "attn_backend": backend}))
        model = model.to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[backend] = []
        for _ in range(3):  # one batch, so that the loss must fall
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[backend].append(loss.item())
    assert losses["sdpa"][-1] < losses["sdpa"][0]  # it trains
    assert max(abs(a - b) for a, b in zip(losses["sdpa"], losses["triton"])) <= 1e-5, losses
