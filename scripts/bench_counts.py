"""Host syncs and collectives per training step (a count, not a timing): what a GPU step would wait for and send,
counted on CPU with the harness of tests/train/counting.py on a real 2-rank gloo group (ZeRO-2 by default, a tiny
Diff model), for 2 and 8 layers and each trainer.diagnostics level. A plain step and a logged step (log_every) are
counted separately; syncs are split by whose code made them (diffllm's, DeepSpeed's).

    .venv/bin/python scripts/bench_counts.py [--layers 2 8] [--levels off cheap full] [--stage 2] [--precision fp32]
                                             [--world-size 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", nargs="+", type=int, default=[2, 8])
    p.add_argument("--levels", nargs="+", default=["off", "cheap", "full"], help="trainer.diagnostics levels")
    p.add_argument("--stage", type=int, default=2, help="ZeRO stage")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--json", help="also write the rows to this file (scripts/bench_all.py reads it)")
    return p.parse_args()


def owners(d: dict) -> str:
    return " + ".join(f"{n} {o}" for o, n in d.items()) or "0"


def main() -> None:
    args = parse()
    from tests.distributed import run_distributed
    from tests.train.counted_step import Spec, count_all

    specs = [
        Spec(stage=args.stage, precision=args.precision, layers=n, diagnostics=level)
        for n in args.layers
        for level in args.levels
    ]
    t0 = time.time()
    results = run_distributed(count_all, world_size=args.world_size, args=(specs,), timeout=1800)[0]
    rows = []
    for spec in specs:
        r = results[spec.name]
        [plain], [logged] = r["plain"], r["logged"]
        rows.append(
            {
                "layers": spec.layers,
                "diagnostics": spec.diagnostics,
                "plain_syncs": plain["syncs"],
                "plain_syncs_by_owner": plain["syncs_by_owner"],
                "plain_collectives": plain["collectives"],
                "logged_syncs": logged["syncs"],
                "logged_syncs_by_owner": logged["syncs_by_owner"],
                "logged_collectives": logged["collectives"],
                "logged_collective_bytes": logged["collective_bytes"],
            }
        )
    print(
        f"# host syncs and collectives per step: ZeRO-{args.stage} {args.precision}, {args.world_size} ranks, "
        f"tiny Diff (d_model 32), 1 micro-batch; {time.time() - t0:.0f} s\n"
        "(a sync: a value the host waits for, a blocking copy included; owners: whose code made it)\n"
    )
    print(
        "| layers | diagnostics | plain: syncs | plain: collectives | logged: syncs | logged: collectives | "
        "logged: collective bytes |\n|---|---|---|---|---|---|---|"
    )
    for row in rows:
        print(
            f"| {row['layers']} | {row['diagnostics']} | {row['plain_syncs']} ({owners(row['plain_syncs_by_owner'])})"
            f" | {row['plain_collectives']} | {row['logged_syncs']} ({owners(row['logged_syncs_by_owner'])}) | "
            f"{row['logged_collectives']} | {row['logged_collective_bytes']:,} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"stage": args.stage, "world_size": args.world_size, "rows": rows}))


if __name__ == "__main__":
    main()
