"""`python -m diffllm.train [overrides]`, also under `torchrun -m diffllm.train` and the `deepspeed` launcher."""

from ..lifeline import tie_rank

tie_rank()  # first: a launcher killed while this rank imports torch and DeepSpeed leaves no rank behind
from .app import main  # noqa: E402

main()
