"""`python -m diffllm.train [overrides]`, also under `torchrun -m diffllm.train` and the `deepspeed` launcher."""

from .app import main

main()
