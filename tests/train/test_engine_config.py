"""DeepSpeed configured for the model's scale (train/zero.py, engine.py): the knobs follow transformers' own "auto"
derivation, trainer.deepspeed overrides each of them, and a real 2-rank gloo engine at ZeRO-1, -2 and -3 runs with
them (read back from DeepSpeed's optimizer, its parameter coordinator and its parsed config) and trains bit for bit as
it does at DeepSpeed's defaults; trainer.compile hands the whole model to DeepSpeed's engine.compile()."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from diffllm.train.config import OptimConfig, TrainerConfig, plan_budget
from diffllm.train.engine import deepspeed_config, with_zero_knobs
from diffllm.train.zero import bucket_bytes, zero_knobs
from tests.distributed import run_distributed

SEQ, WIDTH = 16, 32  # the 2-rank engines' model: d_model 32, so a reduce bucket of 1,024 elements


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("d_model", [64, 1536, 2048, 5120])
def test_bucket_sizes_are_transformers_auto_values(stage, d_model):
    """transformers' HfTrainerDeepSpeedConfig fills "auto" from the model's hidden size: the same numbers here."""
    hf = pytest.importorskip("transformers.integrations.deepspeed")
    auto = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    ds = hf.HfTrainerDeepSpeedConfig({"zero_optimization": {"stage": stage, **dict.fromkeys(auto, "auto")}})
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=d_model))
    ds.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda n: 0), model, 100)
    filled = {k: v for k, v in ds.config["zero_optimization"].items() if v != "auto" and k in auto}
    ours = zero_knobs(stage, d_model)
    assert filled == {k: ours[k] for k in filled}
    assert len(filled) == (3 if stage == 3 else 1)


def test_every_knob_is_overridable_and_zero0_has_none():
    trainer = TrainerConfig(
        zero_stage=2,
        micro_batch_size=2,
        global_batch_tokens=64,
        tokens=64,
        deepspeed={"zero_optimization": {"overlap_comm": False, "reduce_bucket_size": 123}},
    )
    budget = plan_budget(trainer, 32, 1)
    for ds in (
        deepspeed_config(trainer, OptimConfig(), budget, "fp32", d_model=512),
        with_zero_knobs(deepspeed_config(trainer, OptimConfig(), budget, "fp32"), 512),
    ):
        zero = ds["zero_optimization"]
        assert zero == {**zero_knobs(2, 512), "stage": 2, "overlap_comm": False, "reduce_bucket_size": 123}
    assert zero_knobs(0, 512) == {}
    bare = TrainerConfig(zero_stage=0, micro_batch_size=2, global_batch_tokens=64, tokens=64)
    assert deepspeed_config(bare, OptimConfig(), budget, "fp32", d_model=512)["zero_optimization"] == {"stage": 0}


def _deepspeed_defaults(stage: int) -> dict:
    """DeepSpeed's own defaults for the keys zero_knobs sets (its pydantic model's field defaults, by alias), with
    overlap_comm as its validator resolves it: on at ZeRO-3 only."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    fields = {(f.alias or name): f.default for name, f in DeepSpeedZeroConfig.model_fields.items()}
    return {k: (stage == 3 if k == "overlap_comm" else fields[k]) for k in zero_knobs(stage, WIDTH)}


def _read_back(engine) -> dict:
    """The knobs as DeepSpeed runs them: its ZeRO optimizer's attributes, ZeRO-3's parameter coordinator settings, and
    overlap_comm from its parsed config (the stage-3 optimizer keeps no attribute of it)."""
    opt = engine.optimizer
    got = {"contiguous_gradients": opt.contiguous_gradients, "reduce_bucket_size": opt.reduce_bucket_size}
    if engine.zero_optimization_stage() < 3:
        got.update(overlap_comm=opt.overlap_comm, reduce_scatter=opt.reduce_scatter)
        got.update(allgather_bucket_size=opt.allgather_bucket_size)
        return got
    offload = opt.parameter_offload
    got.update(
        overlap_comm=engine._config.zero_config.overlap_comm,
        stage3_prefetch_bucket_size=offload._prefetch_bucket_sz,
        stage3_param_persistence_threshold=offload.param_numel_persistence_threshold,
        stage3_max_live_parameters=offload._max_available_parameters_in_numel,
        stage3_max_reuse_distance=offload._max_reuse_distance_in_numel,
    )
    return got


def _model():
    from diffllm.model import ModelConfig

    return ModelConfig(arch="diff", vocab_size=256, d_model=WIDTH, n_layers=2, n_heads=2, max_seq_len=SEQ)


def _train(stage: int, override: dict) -> dict:
    """A fresh engine (Diff, fp32, d_model 32, 2 layers) at `stage` with `override` over the knobs: 3 steps of 2
    micro-batches on this rank's own tokens. The knobs read back, the parameters before and after, the persistent
    ones' names."""
    import deepspeed
    import torch

    from diffllm.train.engine import build_engine
    from diffllm.train.optim import UpdateGate

    trainer = TrainerConfig(
        zero_stage=stage,
        micro_batch_size=2,
        global_batch_tokens=2 * 2 * SEQ * 2,  # grad accumulation 2 on 2 ranks
        tokens=3 * 2 * 2 * SEQ * 2,
        deepspeed={"zero_optimization": override},
    )
    opt = OptimConfig(lr=1e-2, warmup_steps=0)
    ds = deepspeed_config(trainer, opt, plan_budget(trainer, SEQ, 2), "fp32")
    engine, _ = build_engine(_model(), trainer, opt, ds, seed=0, gate=UpdateGate())
    params = list(engine.module.parameters())

    def gathered() -> list:
        with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
            return [p.detach().clone() for p in params]

    before = gathered()
    gen = torch.Generator().manual_seed(torch.distributed.get_rank())
    held = []  # read inside the first backward (ZeRO-1/2 allocate the buckets for each backward and free them after)
    hook = engine.module.tok_embeddings.weight.register_hook(lambda g: held.append(_bucket_buffer_bytes(engine)))
    for _ in range(3):
        for _ in range(2):
            tokens = torch.randint(0, 256, (2, SEQ + 1), generator=gen)
            engine.backward(engine(tokens[:, :-1], targets=tokens[:, 1:]))
        engine.step()
    hook.remove()
    persistent = [n for n, p in engine.module.named_parameters() if getattr(p, "ds_persist", False)]
    out = {"knobs": _read_back(engine), "held": held[0], "persistent": persistent}
    return {**out, "before": before, "after": gathered()}


def _bucket_buffer_bytes(engine) -> int:
    """Bytes of the gradient bucket buffers DeepSpeed's ZeRO optimizer holds (its `ipg_buckets`: a list of buffers at
    ZeRO-1/2, one buffer at ZeRO-3)."""
    buffers = []
    for bucket in engine.optimizer.ipg_buckets.values():
        buffers += bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]
    return sum(b.numel() * b.element_size() for b in buffers if b is not None)


def _engines_at_every_stage() -> dict:
    import deepspeed
    import torch

    from diffllm.train.dist import skip_shm_op
    from diffllm.train.engine import build_engine
    from diffllm.train.optim import UpdateGate

    skip_shm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    out: dict = {}
    for stage in (1, 2, 3):
        ours, theirs = _train(stage, {}), _train(stage, _deepspeed_defaults(stage))
        out[stage] = {
            "knobs": ours["knobs"],
            "defaults": theirs["knobs"],
            "moved": not all(torch.equal(a, b) for a, b in zip(ours["before"], ours["after"])),
            "same": all(torch.equal(a, b) for a, b in zip(ours["after"], theirs["after"])),
            "persistent": ours["persistent"],
            "held": ours["held"],
            "held_at_defaults": theirs["held"],
            "persistent_at_defaults": theirs["persistent"],
        }
    trainer = TrainerConfig(zero_stage=2, micro_batch_size=2, global_batch_tokens=4 * SEQ, tokens=4 * SEQ, compile=True)
    ds = deepspeed_config(trainer, OptimConfig(), plan_budget(trainer, SEQ, 2), "fp32")
    engine, _ = build_engine(_model(), trainer, OptimConfig(), ds, seed=0, gate=UpdateGate())
    out["compiled"] = (engine.is_compiled, getattr(engine.module, "_compiled_call_impl", None) is not None)
    out["blocks_compiled"] = any(getattr(b, "_compiled_call_impl", None) is not None for b in engine.module.layers)
    return out


@pytest.mark.slow  # one 2-rank launch: seven engines, 18 optimizer steps
def test_engines_run_with_the_knobs_and_train_as_at_deepspeeds_defaults():
    """Read back from each engine: the knobs zero_knobs gives; the reference engines really ran at DeepSpeed's
    defaults; after 3 steps (2 micro-batches each, 2 ranks) every parameter equals the reference's bit for bit. ZeRO-3
    keeps only the tensors of at most 10 x d_model = 320 elements whole (norms, Diff's lambdas), where DeepSpeed's 1e5
    kept the whole model whole; the gradient buckets DeepSpeed holds are the bytes the planner counts (train/zero.py
    bucket_bytes: 2 x 1,024 x 4 B at ZeRO-1/2 with overlap_comm, 1 x 5e8 x 4 B at its defaults); trainer.compile
    compiles the whole model through engine.compile(), not its blocks."""
    import torch

    from diffllm.model import DecoderLM

    with torch.device("meta"):
        sizes = {n: p.numel() for n, p in DecoderLM(_model()).named_parameters()}
    small = [n for n, size in sizes.items() if size <= 10 * WIDTH]  # norms, subln, the lambda vectors
    every = [n for n, size in sizes.items() if size <= 10**5]  # the whole model
    assert small and len(small) < len(every) == len(sizes)
    ranks = run_distributed(_engines_at_every_stage, world_size=2, timeout=600)
    for rank in ranks:
        for stage in (1, 2, 3):
            got = rank[stage]
            print(f"ZeRO-{stage} read back: {got['knobs']}")
            assert got["knobs"] == zero_knobs(stage, WIDTH)
            assert got["defaults"] == _deepspeed_defaults(stage)
            assert got["moved"] and got["same"]
            for knobs, held in ((got["knobs"], got["held"]), (got["defaults"], got["held_at_defaults"])):
                assert held == bucket_bytes(stage, knobs, 0, 0, 0, width=4).held > 0  # fp32 gradients on CPU
        assert rank[3]["persistent"] == small and rank[3]["persistent_at_defaults"] == every
        assert rank["compiled"] == (True, True) and not rank["blocks_compiled"]
