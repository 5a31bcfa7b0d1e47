"""The one accelerator table: planner names and device-name matching agree."""

from diffllm.hardware import GPUS, lookup, peak_tflops


def test_every_planner_gpu_is_found_by_its_own_device_names():
    for gpu in GPUS.values():
        for m in gpu.match:
            assert peak_tflops(f"NVIDIA {m}") == gpu.bf16_tflops, (gpu.name, m)
    assert lookup("H200").memory_gib == 140.4
