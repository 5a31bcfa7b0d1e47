"""`diffllm eval lm-eval`: EleutherAI's lm-evaluation-harness (pinned: the `eval` extra, lm-eval==0.4.13) on a
trained run, through a `TemplateLM` adapter over our own scorer, offline.

    loglikelihood          TemplateLM splits context/continuation; we score with common.score_continuations
    loglikelihood_rolling  lm-eval's disjoint rolling windows of the model's context, EOS as the first context
    generate_until         greedy decoding (eval/generate.py) until a stop string or max_gen_toks
Tasks: ours under diffllm/eval/tasks/ (plays_cloze: 300 multiple-choice items from the held-out plays), plus any
lm-eval task whose dataset is already in the local HF cache (nothing is downloaded: HF_*_OFFLINE are set).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from ..config import run_key_values
from .common import EvalError, load_run, out_dir, say, score_continuations, write_json

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
PIN = "0.4.13"


def require_lm_eval():
    try:
        import lm_eval
    except ImportError:
        raise EvalError(f"lm-eval is not installed; pip install 'diffllm[eval]' (lm-eval=={PIN})") from None
    return lm_eval


def adapter(model, tok, batch_size: int = 16):
    """A lm_eval TemplateLM over a DecoderLM in memory (built lazily: lm-eval is an optional extra)."""
    require_lm_eval()
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from .generate import Sampling, cut_at_stop, decode, full_forward

    class DiffLLM(TemplateLM):
        def __init__(self):
            super().__init__()
            self.model, self.tok, self.batch_size = model, tok, batch_size
            self.max_length = model.cfg.max_seq_len

        @property
        def eot_token_id(self) -> int:
            return self.tok.eos_id

        def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> List[int]:
            return self.tok.encode(string)

        def tok_decode(self, tokens, **kwargs) -> str:
            return self.tok.decode(tokens)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            pairs = [(list(ctx), list(cont)) for _, ctx, cont in requests]
            return score_continuations(self.model, pairs, self.max_length, self.batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
            out = []
            for (text,) in [r.args for r in requests]:
                windows = [
                    make_disjoint_window(w)
                    for w in get_rolling_token_windows(
                        token_list=self.tok_encode(text),
                        prefix_token=self.eot_token_id,
                        max_seq_len=self.max_length,
                        context_len=1,
                    )
                ]
                out.append(
                    sum(ll for ll, _ in score_continuations(self.model, windows, self.max_length, self.batch_size))
                )
            return out

        def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
            out = []
            for context, gen_kwargs in [r.args for r in requests]:
                until = gen_kwargs.get("until") or []
                until = tuple([until] if isinstance(until, str) else until)
                ids = self.tok_encode(context)
                max_new = int(gen_kwargs.get("max_gen_toks", 64))
                ids = ids[-(self.max_length - max_new) :]  # keep room for the answer, as HFLM does
                new, _ = decode(
                    full_forward(self.model), ids, max_new, Sampling(), self.eot_token_id, until, self.tok.decode
                )
                out.append(cut_at_stop(self.tok.decode(new), until))
            return out

    return DiffLLM()


def task_manager(tmp: Path):
    """lm-eval's TaskManager with our local tasks, their data paths made absolute in a temporary copy."""
    from lm_eval.tasks import TaskManager

    for folder in TASKS_DIR.iterdir():
        if folder.is_dir():
            dest = tmp / folder.name
            dest.mkdir(parents=True, exist_ok=True)
            for yml in folder.glob("*.yaml"):
                data = next(folder.glob("*.jsonl"))
                (dest / yml.name).write_text(yml.read_text().replace("__DATA_FILE__", str(data)))
    return TaskManager(include_path=str(tmp))


def evaluate(
    model, tok, tasks: List[str], limit: Optional[int] = None, batch_size: int = 16, num_fewshot: Optional[int] = None
) -> dict:
    """lm-eval's results dict ({"results": {task: {metric: value}}, ...}) for a model in memory."""
    require_lm_eval()
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    from lm_eval import simple_evaluate

    with tempfile.TemporaryDirectory() as tmp:
        tm = task_manager(Path(tmp))
        known = set(tm.all_tasks)
        for t in tasks:
            if t not in known:
                import difflib

                near = difflib.get_close_matches(t, sorted(known), n=1)
                raise EvalError(f"tasks: unknown task {t!r}" + (f"; did you mean {near[0]}?" if near else ""))
        try:
            with quiet_git_probe():
                return simple_evaluate(
                    model=adapter(model, tok, batch_size),
                    tasks=tasks,
                    task_manager=tm,
                    limit=limit,
                    num_fewshot=num_fewshot,
                    log_samples=False,
                )
        except ConnectionError as e:
            raise EvalError(
                f"tasks: a task's data is not in the local cache and nothing may be downloaded "
                f"({str(e).splitlines()[0][:100]})"
            ) from None


@contextlib.contextmanager
def quiet_git_probe():
    """Inside: lm-eval's record of the current folder's git commit (`git describe --always`, which prints "fatal: not
    a git repository" to the terminal outside one) runs with git's stderr discarded; the same value is recorded."""
    import subprocess

    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    def probe() -> Optional[str]:
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError):
            return get_commit_from_path(os.getcwd())

    saved, evaluator.get_git_commit_hash = evaluator.get_git_commit_hash, probe
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = saved


@dataclass
class LmEvalConfig:
    """lm-evaluation-harness tasks on a trained run, offline (default: our local plays_cloze task)."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    # lm-eval task names (local tasks: diffllm/eval/tasks/)
    tasks: List[str] = field(default_factory=lambda: ["plays_cloze"])
    limit: Optional[int] = None  # documents per task (null: all)
    num_fewshot: Optional[int] = None  # demonstrations per prompt; null: each task's own default
    batch_size: int = 16  # requests per forward
    out: Optional[str] = None  # folder for lm_eval.json; null: <run>/eval


def run_lm_eval(c: LmEvalConfig) -> dict:
    from .report import markdown

    require_lm_eval()
    run, mcfg, model, tok = load_run(c.run, c.step)
    res = evaluate(model, tok, list(c.tasks), c.limit, c.batch_size, c.num_fewshot)
    results = {t: {k: v for k, v in m.items() if isinstance(v, (int, float))} for t, m in res["results"].items()}
    rows = [
        [t, k.split(",")[0], v]
        for t, m in results.items()
        for k, v in m.items()
        if "stderr" not in k and k != "sample_len"
    ]
    table = markdown(["task", "metric", "value"], rows)
    write_json(
        out_dir(c.out, run.dir) / "lm-eval.json",
        {"run": str(run.dir), "arch": mcfg.arch, "step": run.checkpoint(c.step).step, "results": results},
    )
    print(table)
    say(f"wrote {out_dir(c.out, run.dir)}/lm-eval.json")
    return results


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval lm-eval", LmEvalConfig, run_lm_eval, argv)


if __name__ == "__main__":
    main()
