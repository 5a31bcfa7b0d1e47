"""`python -m diffllm.train.universal <ds_to_universal's arguments>`: DeepSpeed's ds_to_universal (the conversion of a
checkpoint for another world size or ZeRO stage), with every file it reads loaded weights-only (diffllm/runfiles.py
`weights_only`): a checkpoint file whose pickle would run code is refused, not run. It converts in this process
(diffllm asks it for one worker)."""

import runpy

from ..runfiles import weights_only

if __name__ == "__main__":
    with weights_only():
        runpy.run_module("deepspeed.checkpoint.ds_to_universal", run_name="__main__", alter_sys=True)
