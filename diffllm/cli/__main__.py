"""`python -m diffllm.cli <command> ...`: the same as `diffllm <command> ...`."""

from .main import main

main()
