"""DeepSpeed's ZeRO knobs for the model's scale (overlap, bucket sizes, ZeRO-3 prefetch / persistence / live-parameter
limits) derived from d_model, and the GPU bytes DeepSpeed allocates for them. No torch import: `diffllm plan` and the
launch check read them as cheaply as the engine does.

The derivation is transformers' DeepSpeed integration's for its "auto" values (integrations/deepspeed.py,
`HfTrainerDeepSpeedConfig.trainer_config_finalize`): reduce_bucket_size = hidden^2, stage3_prefetch_bucket_size =
0.9 hidden^2, stage3_param_persistence_threshold = 10 hidden. The rest follows DeepSpeed's config docs
(runtime/zero/config.py, docs/_pages/config-json.md) and transformers' ZeRO-2/3 examples (docs deepspeed.md):
overlap_comm on (DeepSpeed leaves it off below ZeRO-3), contiguous gradients and reduce-scatter on, the all-gather
bucket as large as the reduce bucket, stage3_max_live_parameters = stage3_max_reuse_distance = 1e9 (~2 GB of bf16:
"the memory is shared ... it's not additive"). `trainer.deepspeed.zero_optimization.<key>` overrides any of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

LIVE_PARAMETERS = 10**9  # DeepSpeed's default and transformers' example for stage3_max_live_parameters / reuse distance


def zero_knobs(stage: int, d_model: int) -> dict:
    """The `zero_optimization` keys diffllm sets for ZeRO `stage` on a model `d_model` wide ({} for ZeRO-0)."""
    if stage == 0:
        return {}
    bucket = d_model * d_model  # transformers: reduce_bucket_size "auto" = hidden_size * hidden_size
    bucket += bucket % 2  # stage_1_and_2.py asserts the all-gather bucket is a multiple of 2 (4-byte NCCL alignment)
    if stage in (1, 2):
        return {
            "overlap_comm": True,  # reduce each bucket on a side stream while backward goes on (default off at 1/2)
            "contiguous_gradients": True,  # gradients copied into the reduce bucket as they come (no fragmentation)
            "reduce_scatter": True,  # reduce-scatter / reduce, not a full all-reduce of every bucket
            "reduce_bucket_size": bucket,  # elements per gradient bucket (DeepSpeed's default: 5e8)
            # elements per parameter all-gather after the step; only read where torch lacks all_gather_into_tensor
            # (runtime/utils.py all_gather_dp_groups), which NCCL and gloo both have
            "allgather_bucket_size": bucket,
        }
    return {
        "overlap_comm": True,  # already DeepSpeed's default at ZeRO-3; set so that it is read back and printed
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
        "stage3_prefetch_bucket_size": int(0.9 * d_model * d_model),  # transformers: 0.9 hidden^2
        "stage3_param_persistence_threshold": 10 * d_model,  # transformers: 10 hidden (norms, biases, lambdas stay)
        "stage3_max_live_parameters": LIVE_PARAMETERS,
        "stage3_max_reuse_distance": LIVE_PARAMETERS,
    }


def merged_knobs(stage: int, d_model: int, deepspeed: Mapping) -> dict:
    """zero_knobs with `trainer.deepspeed`'s own zero_optimization keys over them (what the engine will run with)."""
    return {**zero_knobs(stage, d_model), **dict(deepspeed.get("zero_optimization", {}) or {})}


@dataclass(frozen=True)
class BucketBytes:
    """GPU bytes DeepSpeed allocates for its communication at these knobs (bf16 buckets), per GPU."""

    held: float  # the gradient bucket buffer(s) DeepSpeed holds through backward
    flat_copy: float  # the copy of a bucket each reduction makes (ZeRO-1/2 allreduce_bucket, ZeRO-3 torch.cat)
    live_params: float  # ZeRO-3: gathered bf16 parameters beyond DeepSpeed's own 4 B x largest-layer allowance
    persistent: float  # ZeRO-3: parameters below the persistence threshold, whole on every GPU (bf16 + fp32 grad)

    @property
    def reduce(self) -> float:
        return self.held + self.flat_copy

    @property
    def total(self) -> float:
        return self.reduce + self.live_params + self.persistent


def bucket_bytes(
    stage: int, knobs: Mapping, psi: int, largest_layer: int, small_params: int, width: int = 2
) -> BucketBytes:
    """What DeepSpeed 0.19 allocates for `knobs` (zero_optimization keys, DeepSpeed's defaults where absent) with `psi`
    parameters, the largest module holding `largest_layer` of them and `small_params` in tensors below the ZeRO-3
    persistence threshold; `width` bytes per gradient element (bf16: DeepSpeed reduces in the model's dtype).

    ZeRO-1/2 (runtime/zero/stage_1_and_2.py `setup_buckets`): one reduce_bucket_size buffer with contiguous_gradients,
    a second with overlap_comm (double buffering), and `allreduce_bucket` flattens each bucket into a copy while it
    reduces. ZeRO-3 (stage3.py): one reduce_bucket_size buffer with contiguous_gradients, and reduce_scatter_coalesced's
    torch.cat copy; the parameter coordinator keeps at most stage3_max_live_parameters gathered (prefetch included)
    plus the module being fetched: beyond DeepSpeed's estimator allowance (4 B x the largest layer, in the model
    states) that is 2 B x min(psi, max_live + largest layer) - 4 B x largest layer when positive."""
    if stage == 0:
        return BucketBytes(0.0, 0.0, 0.0, 0.0)
    bucket = float(knobs.get("reduce_bucket_size", 5 * 10**8)) * width
    contiguous = bool(knobs.get("contiguous_gradients", True))
    if stage in (1, 2):
        buffers = (2 if knobs.get("overlap_comm", False) else 1) if contiguous else 0
        return BucketBytes(buffers * bucket, bucket, 0.0, 0.0)
    live = float(knobs.get("stage3_max_live_parameters", LIVE_PARAMETERS))
    gathered = 2.0 * min(psi, live + largest_layer) - 4.0 * largest_layer
    return BucketBytes(bucket if contiguous else 0.0, bucket, max(0.0, gathered), small_params * (2.0 + 4.0))
