"""Document masks (packed rows): a packed window of documents gives the logits and parameter gradients of the same
documents run alone, on every architecture and backend, and the logits in the GPU form (flex attention with the
documents' BlockMask; forward only here: flex has no backward on CPU); one document equals no mask bit for bit;
KV-cached decoding with documents equals the full forward; `Documents` and its BlockMask against hand-built examples
and flex attention's own `create_block_mask`.

The "triton" backend is Diff's fused kernel (Triton's CPU interpreter here: slow, so T stays small); for the other
architectures it is sdpa. The references are the documents run one at a time through the same model, with no mask.
"""

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported anywhere below
    os.environ.setdefault("TRITON_INTERPRET", "1")

from diffllm.model import DecoderLM, KVCache, ModelConfig, kernels, variants  # noqa: E402
from diffllm.model.documents import Documents, doc_ids_from_eos, document_block_mask  # noqa: E402
from diffllm.model.layers import rotary_cos_sin  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
SPLITS = [(5, 9, 4), (8, 3, 7)]  # document lengths of the two rows of one packed (2, 18) window
ARCHS = list(variants())


def doc_ids(splits) -> torch.Tensor:
    """Document lengths per row -> (B, T) ids [0 0 0 1 1 ...], built by hand."""
    return torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in splits])


def spans(lengths) -> list[tuple[int, int]]:
    """Document lengths of one row -> the (start, end) of each document."""
    ends = torch.tensor(lengths).cumsum(0).tolist()
    return list(zip([0] + ends[:-1], ends))


def tiny(arch: str, backend: str) -> DecoderLM:
    """float64, except Diff's fused Triton kernel (fp32/bf16/fp16 only)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=97,
        max_seq_len=32,
        attn_backend=backend,
        rope_interleaved=arch == "diff",
    )
    model = DecoderLM(cfg)
    return model if fused(arch, backend) else model.double()


def fused(arch: str, backend: str) -> bool:
    return arch == "diff" and backend == "triton"


def needs_triton(arch: str, backend: str):
    if fused(arch, backend) and not HAS_TRITON:
        pytest.skip("triton is not installed (pip install -e '.[dev]' brings it)")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def packed(model: DecoderLM, tokens, splits, restart: bool):
    """Logits (B, T, V) of the packed rows with doc_ids, and the parameter gradients of sum(logits * w)."""
    w = torch.randn(*tokens.shape, model.cfg.padded_vocab_size, generator=torch.Generator().manual_seed(2))
    logits = model(tokens, doc_ids=doc_ids(splits), restart_positions=restart)  # (B, T, V)
    return logits, torch.autograd.grad((logits * w.to(logits.dtype)).sum(), list(model.parameters()))


def alone(model: DecoderLM, tokens, splits):
    """The same for every document run alone (B = 1, positions from 0, no mask): logits concatenated back into
    rows, gradients summed over the documents."""
    w = torch.randn(*tokens.shape, model.cfg.padded_vocab_size, generator=torch.Generator().manual_seed(2))
    w = w.to(next(model.parameters()).dtype)
    rows, loss = [], 0.0
    for b, row in enumerate(splits):
        pieces, start = [], 0
        for n in row:
            logits = model(tokens[b : b + 1, start : start + n])  # (1, n, V): the document alone
            loss = loss + (logits * w[b : b + 1, start : start + n]).sum()
            pieces.append(logits)
            start += n
        rows.append(torch.cat(pieces, dim=1))
    return torch.cat(rows), torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "triton"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_documents_equal_the_documents_alone(arch, backend, restart):
    """Logits and every parameter gradient. Without restart_positions the packed documents sit at their offsets;
    RoPE scores depend on relative positions only, so they still equal the documents alone (to rounding).
    The fp32 kernel is held to the documents alone in float64 (eager, same weights). Its lambda gradients are sums
    with cancellation: fp32 puts them 2e-5 to 3.5e-5 (relative to their largest entry) from float64, by CPU (measured
    here and on CI's), restarted or not, so they get 10x tol; a wrong mask is off by O(1), as the end of this test
    shows."""
    needs_triton(arch, backend)
    model = tiny(arch, backend)
    reference = model
    if fused(arch, backend):
        reference = tiny(arch, "eager").double()
        reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 97, (2, sum(SPLITS[0])), generator=torch.Generator().manual_seed(1))
    got, got_grads = packed(model, tokens, SPLITS, restart)
    want, want_grads = alone(reference, tokens, SPLITS)
    tol = 1e-5 if fused(arch, backend) else 1e-10  # fp32 kernel | float64
    assert rel_err(got, want) <= tol
    for (name, _), a, b in zip(model.named_parameters(), got_grads, want_grads):
        loose = fused(arch, backend) and ".lambda_" in name
        assert rel_err(a, b) <= (10 * tol if loose else tol), f"{name}: {rel_err(a, b):.2e}"
    with torch.no_grad():  # the mask is what makes them equal: without it later documents see earlier ones
        assert rel_err(model(tokens), want) > 1e-3


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_documents_equal_the_documents_alone_in_the_gpu_form(arch, restart, monkeypatch):
    """What a GPU runs (kernels.flash_form_on_cpu): flex attention within the documents, every call of one head dim;
    the documents alone run the GPU form's causal calls. float64, logits only (flex has no CPU backward)."""
    model = tiny(arch, "sdpa")
    tokens = torch.randint(0, 97, (2, sum(SPLITS[0])), generator=torch.Generator().manual_seed(1))
    flex_calls = []
    flex = kernels.flex_attention
    monkeypatch.setattr(kernels, "flex_attention", lambda *a, **kw: flex_calls.append(kw) or flex(*a, **kw))
    with kernels.flash_form_on_cpu(), torch.no_grad():
        got = model(tokens, doc_ids=doc_ids(SPLITS), restart_positions=restart)
        assert len(flex_calls) == model.cfg.n_layers * (4 if arch == "diff" else 1)
        assert all(kw["block_mask"] is not None for kw in flex_calls)
        rows = [[model(tokens[b : b + 1, a:z]) for a, z in spans(row)] for b, row in enumerate(SPLITS)]
    want = torch.cat([torch.cat(row, dim=1) for row in rows])  # every document alone, (B, T, V)
    assert rel_err(got, want) <= 1e-10


@pytest.mark.parametrize("block", [4, 8])
def test_the_block_mask_is_flexs_own_and_attends_within_documents(block):
    """document_block_mask (from each tile's first and last document) marks the tiles create_block_mask marks from the
    T x T mask, its full tiles too; flex attention with it equals SDPA with the dense mask in float64, GQA included.
    Rows with one long document, many short ones and tiles cut by the end of the row give empty, partial and full
    tiles."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    splits = [(1, 17, 2, 20, 3), (24, 1, 1, 5, 12)]
    ids = doc_ids(splits)
    B, S = ids.shape
    mine = document_block_mask(ids, block)

    def same_document(b, h, q, kv):
        return (kv <= q) & (ids[b, q] == ids[b, kv])

    ref = create_block_mask(same_document, B, None, S, S, device="cpu", BLOCK_SIZE=block)
    assert torch.equal(mine.to_dense(), ref.to_dense())
    assert torch.equal(mine.full_kv_num_blocks, ref.full_kv_num_blocks) and mine.full_kv_num_blocks.sum() > 0
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, h, S, 8, dtype=torch.float64, generator=g) for h in (4, 2, 2))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=Documents(ids).mask, enable_gqa=True)
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=mine, enable_gqa=True), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("restart", [True, False])
def test_restart_positions_are_those_of_each_document_alone(restart):
    """The RoPE angles every layer receives: per row, those of each document alone from position 0 (restart), or
    the plain positions of the row."""
    model = tiny("transformer", "eager")
    seen = []
    model.layers[0].attn.register_forward_pre_hook(lambda module, args: seen.append(args[1]))  # args: x, cos, sin
    tokens = torch.randint(0, 97, (2, 18), generator=torch.Generator().manual_seed(1))
    model(tokens, doc_ids=doc_ids(SPLITS), restart_positions=restart)
    cfg = model.cfg
    if restart:
        want = torch.stack(
            [
                torch.cat([rotary_cos_sin(n, cfg.rotary_dim, cfg.rope_theta, "cpu", torch.float64)[0] for n in row])
                for row in SPLITS
            ]
        )  # (B, T, r/2)
    else:
        want = rotary_cos_sin(18, cfg.rotary_dim, cfg.rope_theta, "cpu", torch.float64)[0]  # (T, r/2)
    assert torch.equal(seen[0], want)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_one_document_equals_no_mask_bit_for_bit(arch, backend):
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, max_seq_len=32, attn_backend=backend
    )
    model = DecoderLM(cfg)
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(tokens)
        assert torch.equal(model(tokens, doc_ids=torch.zeros(2, 20, dtype=torch.long)), plain)
        assert torch.equal(model(tokens, doc_ids=torch.zeros(2, 20, dtype=torch.long), restart_positions=True), plain)


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "triton"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_with_documents_equals_the_full_forward(arch, backend, restart):
    """A prefill across a document boundary, a chunk, then one token at a time, each with its tokens' doc ids."""
    needs_triton(arch, backend)
    model = tiny(arch, backend)
    tokens = torch.randint(0, 97, (2, 18), generator=torch.Generator().manual_seed(1))
    ids = doc_ids(SPLITS)
    with torch.no_grad():
        full = model(tokens, doc_ids=ids, restart_positions=restart)
        cache = KVCache(max_len=18)
        steps = [(0, 7), (7, 12)] + [(t, t + 1) for t in range(12, 18)]
        pieces = [model(tokens[:, a:b], cache, doc_ids=ids[:, a:b], restart_positions=restart) for a, b in steps]
    tol = 1e-5 if fused(arch, backend) else 1e-10
    assert rel_err(torch.cat(pieces, dim=1), full) <= tol


def test_documents_against_hand_built_examples():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 2, 2]])
    docs = Documents(ids, restart_positions=True)
    assert docs.starts.tolist() == [[0, 0, 0, 3, 3, 5], [0, 1, 1, 1, 4, 4]]
    assert docs.ends.tolist() == [[3, 3, 3, 5, 5, 6], [1, 4, 4, 4, 6, 6]]
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 0, 1]]
    assert Documents(ids).positions.tolist() == [list(range(6))] * 2
    row1 = [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    assert docs.mask.shape == (2, 1, 6, 6) and docs.mask[1, 0].int().tolist() == row1
    # a decode step: the last 2 of 6 positions are queries (bottom-right aligned), positions within their document
    step = Documents(ids, n_queries=2, restart_positions=True)
    assert step.mask[1, 0].int().tolist() == row1[-2:] and step.positions.tolist() == [[1, 0], [0, 1]]
    with pytest.raises(ValueError, match="no KV cache"):
        _ = step.block_mask


def test_doc_ids_from_eos():
    eos = 9
    tokens = torch.tensor([[4, 9, 5, 6, 9, 9, 7], [9, 1, 2, 3, 4, 5, 9]])
    assert doc_ids_from_eos(tokens, eos).tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]


def test_doc_id_misuse_is_a_one_line_error():
    model = tiny("transformer", "sdpa")
    tokens = torch.zeros(1, 6, dtype=torch.long)
    with torch.no_grad():
        with pytest.raises(ValueError, match="restart_positions needs doc_ids"):
            model(tokens, restart_positions=True)
        with pytest.raises(ValueError, match="doc_ids: want the tokens' shape"):
            model(tokens, doc_ids=torch.zeros(1, 5, dtype=torch.long))
        cache = KVCache(max_len=12)
        model(tokens, cache)
        with pytest.raises(ValueError, match="not for the 6 cached tokens"):
            model(tokens[:, :1], cache, doc_ids=torch.zeros(1, 1, dtype=torch.long))
        cache = KVCache(max_len=12)
        model(tokens, cache, doc_ids=torch.zeros(1, 6, dtype=torch.long))
        with pytest.raises(ValueError, match="pass doc_ids for the new tokens too"):
            model(tokens[:, :1], cache)
