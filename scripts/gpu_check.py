"""The GPU check's shared parts: the smoke switch, the results file every part appends its rows to, the one table
printed at the end (`gpu_check.py table`), and the backend agreement part (`gpu_check.py agreement`: sdpa and flash
against eager, bf16, whole models of every registered arch). `GPU_CHECK_SMOKE=1` runs the same code on CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # diffllm is imported by the parts that use it, so that
# the table prints whatever failed before it (a missing package included)

SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = torch.float32 if SMOKE else torch.bfloat16
OUT = Path(os.environ.get("GPU_CHECK_OUT") or "/tmp/gpu-check")  # results.jsonl (gpu_check.sh sets it: $OUT there)
COLUMNS = ("part", "model", "setting", "shape", "tokens_s", "mfu", "memory", "result")
HEADER = ("part", "model / shape", "setting", "seq x micro-batch", "tokens/s", "MFU", "peak GiB (plan)", "result")


def preset(name: str, **overrides):
    from diffllm.model.presets import load_preset

    return dataclasses.replace(load_preset(name), **overrides)


def device_label() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu" + (" (smoke)" if SMOKE else "")


def record(**row) -> None:
    """One row of the final table (COLUMNS; missing cells empty), appended at once: a part killed at its time limit
    keeps the rows it wrote."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}")
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "results.jsonl", "a") as f:
        f.write(json.dumps({c: str(row.get(c, "")) for c in COLUMNS}) + "\n")


def interpreter_failure(err: BaseException) -> str | None:
    """Smoke mode only: the row's note when Triton's CPU interpreter could not run a kernel (the GPU image's Triton
    3.6 interpreter fails under its numpy 2.5: TypeError 'only 0-dimensional arrays can be converted to Python
    scalars'; a GPU compiles the kernel instead). None otherwise: then the error is the check's own."""
    if not (SMOKE and type(err).__name__ == "InterpreterError"):
        return None
    import triton

    return f"not run on CPU: Triton {triton.__version__}'s interpreter failed ({str(err).splitlines()[0][:120]})"


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def agreement(arch: str) -> dict[str, float]:
    """Max |logit difference| of sdpa (and flash) against eager on the same weights, in bf16."""
    from diffllm.model import DecoderLM, ModelConfig
    from diffllm.model.kernels import flash_available

    cfg = ModelConfig(arch=arch, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=1000, max_seq_len=512)
    torch.manual_seed(0)
    ref = DecoderLM(ModelConfig(**{**cfg.__dict__, "attn_backend": "eager"})).to(DEVICE, DTYPE)
    tokens = torch.randint(0, 1000, (2, 512), device=DEVICE)
    out, want = {}, ref(tokens).float()
    for backend in ("sdpa", "flash"):
        if backend == "flash" and not flash_available():
            out[backend] = float("nan")
            continue
        m = DecoderLM(ModelConfig(**{**cfg.__dict__, "attn_backend": backend})).to(DEVICE, DTYPE)
        m.load_state_dict(ref.state_dict())
        out[backend] = (m(tokens).float() - want).abs().max().item()
    return out


def agreement_part() -> None:
    from diffllm.model.kernels import flash_available
    from diffllm.model.registry import variants

    print(
        f"device: {device_label()}, torch {torch.__version__}, flash-attn: {'yes' if flash_available() else 'no'}"
        f"\n\n| arch | sdpa vs eager ({str(DTYPE)[6:]} max abs) | flash vs eager |\n|---|---|---|"
    )
    for arch in variants():  # every registered attention variant, the baseline (Transformer) first
        a = agreement(arch)
        print(f"| {arch} | {a['sdpa']:.3g} | {a['flash']:.3g} |", flush=True)
        flash = "flash-attn not installed" if a["flash"] != a["flash"] else f"flash {a['flash']:.3g}"
        record(
            part="agreement",
            model=arch,
            setting=f"vs eager, {str(DTYPE)[6:]}",
            shape="512 x 2",
            result=f"max abs logit diff: sdpa {a['sdpa']:.3g}, {flash}",
        )


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "agreement"
    if what == "agreement":
        agreement_part()
    elif what == "table":
        path = OUT / "results.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        print(f"\n# GPU check: {device_label()}, torch {torch.__version__}\n\n{table(rows)}")
    else:
        raise SystemExit(f"gpu_check.py: unknown part {what!r} (agreement | table)")


if __name__ == "__main__":
    main()
