"""The launch command builders: exact argv for torchrun and the deepspeed runner, the sbatch script (checked with
bash -n), hostfile errors, and the CLI's option parsing and one-line errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffllm.launch.argv import LaunchConfig, deepspeed_argv, torchrun_argv
from diffllm.launch.cli import parse_args
from diffllm.launch.hostfile import read_hostfile
from diffllm.launch.slurm import sbatch_script

REPO = Path(__file__).resolve().parents[2]


def test_torchrun_one_node_and_many():
    one = torchrun_argv(LaunchConfig(procs=2), ["model=diff-tiny"])
    assert one == [
        "torchrun",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        "--rdzv_id",
        "diffllm",
        "--rdzv_conf",
        "join_timeout=600",
        "--signals_to_handle",
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "--shutdown_timeout",
        "240",
        "-m",
        "diffllm.train",
        "model=diff-tiny",
    ]
    many = torchrun_argv(LaunchConfig(nodes=4, procs=8, master_addr="node-1", master_port=29400, node_rank=3), [])
    assert many[many.index("--rdzv_endpoint") + 1] == "node-1:29400" and many[many.index("--nnodes") + 1] == "4"
    assert many[many.index("--node_rank") + 1] == "3"


def test_deepspeed_with_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# two nodes\nnode-1 slots=8\nnode-2 slots=8  # comment\n")
    argv = deepspeed_argv(LaunchConfig(launcher="deepspeed", nodes=2, procs=8, hostfile=str(hf)), ["seed=1"])
    assert argv == [
        "deepspeed",
        "--hostfile",
        str(hf),
        "--launcher",
        "pdsh",
        "--num_nodes",
        "2",
        "--num_gpus",
        "8",
        "--master_port",
        "29500",
        "--module",
        "diffllm.train",
        "seed=1",
    ]


def test_deepspeed_runner_accepts_our_argv():
    """DeepSpeed's own argument parser takes every flag we generate."""
    from deepspeed.launcher.runner import parse_args as ds_parse

    argv = deepspeed_argv(LaunchConfig(launcher="deepspeed", procs=2, master_addr="10.0.0.1"), ["model=diff-tiny"])
    args = ds_parse(argv[1:])
    assert (args.num_gpus, args.master_addr, args.module, args.user_script) == (2, "10.0.0.1", True, "diffllm.train")


def test_torchrun_parser_accepts_our_argv():
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(torchrun_argv(LaunchConfig(nodes=2, procs=4, master_addr="h"), ["x=1"])[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_endpoint, args.module, args.training_script) == (
        "2",
        "4",
        "h:29500",
        True,
        "diffllm.train",
    )
    assert args.shutdown_timeout == 240 and "SIGUSR1" in args.signals_to_handle


@pytest.mark.parametrize(
    "text,match",
    [
        ("node-1\n", r"hosts:1: 'node-1' has no slots=N"),
        ("node-1 slots=0\n", r"hosts:1: 'node-1 slots=0': slots must be a positive integer"),
        ("# nothing\n\n", r"hosts: lists no hosts with slots"),
        ("a slots=2\na slots=2\n", r"hosts:2: host 'a' is listed twice"),
    ],
)
def test_bad_hostfiles(tmp_path, text, match):
    hf = tmp_path / "hosts"
    hf.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_hostfile(hf)


def test_hostfile_too_small(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("a slots=4\n")
    with pytest.raises(ValueError, match=r"lists 1 host\(s\), but nodes=2"):
        deepspeed_argv(LaunchConfig(launcher="deepspeed", nodes=2, procs=4, hostfile=str(hf)), [])
    with pytest.raises(ValueError, match=r"host 'a' has slots=4, but procs=8"):
        deepspeed_argv(LaunchConfig(launcher="deepspeed", nodes=1, procs=8, hostfile=str(hf)), [])


def test_example_hostfile_parses():
    assert read_hostfile(REPO / "scripts" / "hostfile.example") == {"node-1": 8, "node-2": 8}


def test_sbatch_gpus_per_node():
    def gres(**kw):
        return [
            ln
            for ln in sbatch_script(LaunchConfig(launcher="slurm", procs=4, **kw), []).splitlines()
            if "gpus-per-node" in ln
        ]

    assert gres() == ["#SBATCH --gpus-per-node=4"] and gres(gpus_per_node=8) == ["#SBATCH --gpus-per-node=8"]
    assert gres(gpus_per_node=0) == []  # a CPU cluster: asking for GPUs would never be scheduled


def test_sbatch_script():
    cfg = LaunchConfig(
        launcher="slurm",
        nodes=4,
        procs=8,
        master_port=0,
        partition="gpu",
        account="proj",
        time="12:00:00",
        container_image="/images/diffllm.sqsh",
        setup=["source .venv/bin/activate"],
        env={"NCCL_DEBUG": "WARN"},
    )
    text = sbatch_script(cfg, ["model=diff-13.1b", "run_dir=runs/${model.name}"])
    for line in [
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --time=12:00:00",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        "source .venv/bin/activate",
        "export NCCL_DEBUG=WARN",
        'scontrol requeue "$SLURM_JOB_ID"',
    ]:
        assert line in [x.strip() for x in text.splitlines()], line
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--container-image=/images/diffllm.sqsh" in srun
    assert '--rdzv_endpoint "${HEAD_NODE}:${RDZV_PORT}"' in srun and '--rdzv_id "${SLURM_JOB_ID}"' in srun
    assert any(ln.startswith("RDZV_PORT=$((15000 + SLURM_JOB_ID % 20000))") for ln in text.splitlines())
    assert "'run_dir=runs/${model.name}'" in srun  # a Hydra interpolation stays verbatim (single quotes)
    assert srun.endswith(" &") and "SIGUSR1" in srun
    bash = shutil.which("bash")
    assert subprocess.run([bash, "-n"], input=text, text=True).returncode == 0  # valid shell


def _sbatch_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_sbatch_takes_the_whole_node_runs_where_launch_ran_with_this_torchrun(tmp_path, monkeypatch):
    """The script asked for no CPUs or memory (SLURM's default: one core for a torchrun agent, 8 ranks and their
    data workers), called `torchrun` by its bare name and had no --chdir (relative run dirs followed sbatch's cwd)."""
    monkeypatch.chdir(tmp_path)
    cfg, _ = parse_args(["--launcher", "slurm", "--nodes", "2", "--procs", "8"])
    text = sbatch_script(cfg, ["run_dir=runs/x"])
    sb = _sbatch_lines(text)
    assert {"#SBATCH --exclusive", "#SBATCH --mem=0", f"#SBATCH --chdir={tmp_path}"} <= set(sb), sb
    assert not any("--cpus-per-task" in ln for ln in sb)  # the whole node's cores
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.is_file() and f" {torchrun} --nnodes 2 --nproc_per_node 8 " in srun
    image, _ = parse_args(["--launcher", "slurm", "--container-image", "/img.sqsh"])
    assert " torchrun --nnodes 1 " in sbatch_script(image, [])  # inside the image: its own torchrun


def test_sbatch_without_the_whole_node_asks_a_core_per_rank_and_data_worker(tmp_path, capsys):
    from diffllm.launch.cli import run

    shared, _ = parse_args(["--launcher", "slurm", "--procs", "8", "--exclusive", "false", "--dry-run"])
    assert "#SBATCH --cpus-per-task=24" in _sbatch_lines(sbatch_script(shared, [], data_workers=2))
    assert "#SBATCH --exclusive" not in _sbatch_lines(sbatch_script(shared, [], data_workers=2))
    given, _ = parse_args(
        ["--launcher", "slurm", "--procs", "8", "--exclusive", "false", "--cpus-per-task", "16", "--mem", "500G"]
    )
    assert {"#SBATCH --cpus-per-task=16", "#SBATCH --mem=500G"} <= set(_sbatch_lines(sbatch_script(given, [])))
    assert run(shared, ["data.num_workers=3", "trainer.global_batch_tokens=16384"]) == 0  # the train config's workers
    assert "#SBATCH --cpus-per-task=32" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    "cpus, procs, workers, given, threads",
    [(96, 8, 2, "", "4"), (24, 8, 2, "", "1"), (8, 8, 1, "", "1"), (64, 2, 1, "", "16"), (96, 8, 2, "7", "7")],
)
def test_sbatch_omp_threads_share_the_job_cpus(cpus, procs, workers, given, threads):
    """The script's OMP_NUM_THREADS, run by bash as in a job: the CPUs SLURM gave it on the node over the ranks and
    their data workers (at least 1); one set in the job's environment is kept."""
    cfg, _ = parse_args(["--launcher", "slurm", "--procs", str(procs), "--dry-run"])
    script = sbatch_script(cfg, [], data_workers=workers).splitlines()
    line = "\n".join(ln for ln in script if ln.startswith(("CPUS=", "export OMP")))
    env = {"PATH": "/usr/bin:/bin", "SLURM_CPUS_ON_NODE": str(cpus), **({"OMP_NUM_THREADS": given} if given else {})}
    out = subprocess.run(["bash", "-c", f'{line}\necho "$OMP_NUM_THREADS"'], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == threads, out.stderr


FAKE_SRUN = """#!/bin/bash
# srun stand-in: drop srun's own options, run the rest (torchrun) as a child, forward signals to it like srun does
while [[ "$1" == --* ]]; do shift; done
"$@" & child=$!
trap 'kill -USR1 $child' USR1
trap 'kill -TERM $child' TERM
while true; do wait $child; rc=$?; kill -0 $child 2>/dev/null || exit $rc; done
"""
FAKE_TORCHRUN = """#!/bin/bash
# torchrun+trainer stand-in: report the arguments, wait for a signal, 'save' and exit 3 like the trainer
echo "$@" > "$MARKS/args"
trap 'echo usr1 > "$MARKS/signal"; exit 3' USR1
echo started > "$MARKS/started"
while true; do sleep 0.1; done
"""
FAKE_SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then echo node-a; echo node-b; else echo "$@" > "$MARKS/scontrol"; fi
"""


def test_sbatch_script_forwards_the_signal_and_requeues(tmp_path):
    """Run the generated script under bash with stand-ins for srun/torchrun/scontrol; SIGUSR1 to the batch shell
    (what `--signal=B:USR1@300` does) must reach the trainer, and the job must requeue itself and exit with 3."""
    import os
    import signal
    import time

    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir(), marks.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("torchrun", FAKE_TORCHRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(
        sbatch_script(
            LaunchConfig(launcher="slurm", nodes=2, procs=8, master_port=0), ["model=diff-tiny"], executable="torchrun"
        )
    )  # the stand-in on PATH
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "MARKS": str(marks),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node-[a-b]",
    }
    job = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path)
    deadline = time.time() + 30
    while not (marks / "started").exists() and time.time() < deadline:
        time.sleep(0.1)
    job.send_signal(signal.SIGUSR1)
    assert job.wait(timeout=30) == 3
    assert (marks / "signal").read_text().strip() == "usr1"
    assert (marks / "scontrol").read_text().split() == ["requeue", "42"]
    args = (marks / "args").read_text()
    assert "--rdzv_endpoint node-a:15042" in args and "--rdzv_id 42" in args and "--nnodes 2" in args


def test_sbatch_signal_must_leave_time_to_save():
    with pytest.raises(ValueError, match="signal_lead_s=100: must exceed shutdown_timeout_s=240"):
        parse_args(["--launcher", "slurm", "--signal-lead-s", "100"])


def test_parse_args_flags_and_overrides():
    cfg, overrides = parse_args(
        [
            "--nodes",
            "2",
            "--procs=4",
            "--dry-run",
            "model=diff-tiny",
            "--master-addr",
            "h",
            "--node-rank",
            "1",
            "--env",
            "A=1",
            "--",
            "--weird",
        ]
    )
    assert (cfg.nodes, cfg.procs, cfg.dry_run, cfg.master_addr, cfg.node_rank, cfg.env) == (
        2,
        4,
        True,
        "h",
        1,
        {"A": "1"},
    )
    assert overrides == ["model=diff-tiny", "--weird"]
    shell_text = ["--setup", "source ${HOME}/venv/bin/activate", "--env", "LD_LIBRARY_PATH=${CUDA_HOME}/lib64"]
    cfg, _ = parse_args(["--launcher", "slurm", *shell_text])  # shell text, as given: not an OmegaConf interpolation
    assert (cfg.setup, cfg.env) == (["source ${HOME}/venv/bin/activate"], {"LD_LIBRARY_PATH": "${CUDA_HOME}/lib64"})
    slurm, _ = parse_args(["--launcher", "slurm"])
    assert slurm.job_name == "diffllm" and slurm.requeue  # configs/launch/slurm.yaml applied
    with pytest.raises(ValueError, match="--nodez: unknown launch option"):
        parse_args(["--nodez", "2"])
    with pytest.raises(ValueError, match=r"launch.nodes"):
        parse_args(["--nodes", "two"])


@pytest.mark.parametrize(
    "args,match",
    [
        (["--nodes", "2"], r"^--nodes 2: torchrun needs --master-addr <host of node rank 0>"),
        (
            ["--nodes", "2", "--master-addr", "h"],
            r"^--node-rank: missing; with --nodes 2 give each node its rank, 0..1",
        ),
        (["--nodes", "2", "--master-addr", "h", "--node-rank", "2"], r"^--node-rank: 2 is out of range"),
    ],
)
def test_several_torchrun_nodes_need_a_master_and_a_rank(args, match):
    """Accepted before, and no node would ever have found the others."""
    with pytest.raises(ValueError, match=match):
        parse_args(args)
    slurm, _ = parse_args(["--launcher", "slurm", "--nodes", "2"])  # SLURM finds the head node itself
    assert "--nnodes 2" in sbatch_script(slurm, [])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.tokenz=5"], "trainer.tokenz=5: unknown key (did you mean trainer.tokens?)"),
        (["seeed=1"], "seeed=1: unknown key (did you mean seed?)"),
        (["trainer.zero_stage=7"], "trainer.zero_stage: got 7, expected 0, 1, 2 or 3"),
        (["trainer.tokens=5x"], "trainer.tokens: expected a count like 20M, 1.5B or 4096, got '5x'"),
        (["model.d_model=sixty"], "model.d_model"),
    ],
)
def test_train_overrides_are_checked_before_anything_runs(overrides, message):
    from diffllm.launch.checks import check_train_overrides

    with pytest.raises(ValueError) as e:
        check_train_overrides(overrides, world_size=2)
    assert message in str(e.value) and "\n" not in str(e.value)
    check_train_overrides(["model=diff-tiny", "trainer.tokens=40960", "seed=3"], world_size=2)  # valid: no error


def test_help_lists_every_option_with_a_default():
    import dataclasses

    from diffllm.launch.cli import HelpRequested
    from diffllm.launch.help import usage

    text = usage()
    for f in dataclasses.fields(LaunchConfig):
        line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["--" + f.name.replace("_", "-")])
        assert "[default: " in line, line
    assert "--signal-lead-s" in text and "[default: 300]" in text and text.count("diffllm launch --") >= 3
    for flag in ("-h", "--help"):
        with pytest.raises(HelpRequested):
            parse_args(["--procs", "2", flag])


def test_help_examples_pass_the_preflight_checks(tmp_path):
    """`launch --help`'s diff-13.1b example ran the CPU trainer's 4,096-token batch on 32 ranks and exited 2."""
    import shlex

    from diffllm.launch.cli import preflight
    from diffllm.launch.help import EXAMPLES

    (tmp_path / "hosts").write_text("node-1 slots=8\nnode-2 slots=8\n")
    lines = [
        ln.split("#")[0].replace("--hostfile hosts", f"--hostfile {tmp_path}/hosts")
        for ln in EXAMPLES.splitlines()
        if ln.strip().startswith("diffllm launch")
    ]
    assert len(lines) == 4
    for line in lines:
        cfg, overrides = parse_args(shlex.split(line)[2:] + ["--dry-run"])
        preflight(cfg, overrides)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "launch", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.mark.slow
def test_cli_dry_run_and_one_line_errors(tmp_path):
    out = _cli("--nodes", "1", "--procs", "2", "--dry-run", "model=diff-tiny")
    assert (
        out.returncode == 0 and "--nproc_per_node 2" in out.stdout and "-m diffllm.train model=diff-tiny" in out.stdout
    )
    empty = tmp_path / "hosts"
    empty.write_text("# no hosts\n")
    for args, msg in [
        (["--launcher", "deepspeed", "--hostfile", str(empty), "--dry-run"], "lists no hosts"),
        (["--dry-run", "model=nope"], "model=nope: unknown preset"),
        (["--launcher", "mpi"], "no configs/launch/mpi.yaml"),
    ]:
        bad = _cli(*args)
        assert bad.returncode == 2 and msg in bad.stderr and bad.stderr.strip().count("\n") == 0, bad.stderr
