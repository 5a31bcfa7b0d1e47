"""The whole model with its loss compiles as one graph: `torch.compile(DecoderLM, fullgraph=True)` of the forward with
targets, for every arch on the causal, document-mask and restarted-position paths, in fp32 and bf16, in the CPU form
(with gradients) and in a GPU's form (kernels.flash_form_on_cpu: one-head-dim calls, flex attention for documents;
no_grad there, flex has no CPU backward). fullgraph=True fails on any graph break; the backend records the graphs
and runs them uncompiled (dynamo's trace only, no Inductor codegen). A second batch of the same shape reuses the
graph: Diff's per-layer lambda_init constants and the documents' cached tensors compile once. The fast suite runs
each arch's bf16 GPU-form path with restarted documents (the one a GPU trains with doc masks); the slow suite all 48.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from diffllm.model import DecoderLM, ModelConfig, variants
from diffllm.model.kernels import flash_form_on_cpu

PATHS = {
    "causal": lambda ids: {},
    "doc_mask": lambda ids: {"doc_ids": ids},
    "restart_positions": lambda ids: {"doc_ids": ids, "restart_positions": True},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


FAST = ("gpu", "bf16", "restart_positions")  # what a GPU trains with documents; the other 11 per arch run slow


def cases():
    """(arch, path, form, dtype) for every combination, all but FAST marked slow."""
    for arch in variants():
        for path in PATHS:
            for form in ("cpu", "gpu"):
                for dtype in DTYPES:
                    slow = (form, dtype, path) != FAST
                    yield pytest.param(arch, path, form, dtype, marks=pytest.mark.slow if slow else ())


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo caches graphs per code object (DecoderLM.forward) across models: each test starts and leaves empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (2, 24), doc ids): three documents per row, their boundaries differing with the seed."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randint(1, 23, (2, 2), generator=g).sort().values
    ids = (torch.arange(24)[None, None] >= cuts[:, :, None]).sum(1)  # (2, 24) non-decreasing 0..2
    return torch.randint(0, 97, (2, 24), generator=g), ids


@pytest.mark.parametrize("arch,path,form,dtype", list(cases()))
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # the GPU form's flex on CPU
def test_the_model_and_its_loss_compile_as_one_graph(arch, path, dtype, form):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, max_seq_len=32)
    model = DecoderLM(cfg).to(DTYPES[dtype])
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=record)
    gpu = form == "gpu"
    with flash_form_on_cpu() if gpu else contextlib.nullcontext(), torch.no_grad() if gpu else contextlib.nullcontext():
        for seed in (1, 2):
            tokens, ids = batch(seed)
            loss = compiled(tokens, targets=tokens, **PATHS[path](ids))
            torch.testing.assert_close(loss, model(tokens, targets=tokens, **PATHS[path](ids)), rtol=0, atol=0)
            if not gpu:
                loss.backward()
    assert len(graphs) == 1
