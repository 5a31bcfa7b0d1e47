"""The environment a plain `diffllm train` gives itself: a world of one whose rendezvous store binds a port the OS
picks (a port chosen first could be taken by another process before the store binds it: EADDRINUSE, seen when three
one-process runs started side by side); launchers' variables are left as they are."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from diffllm.train.dist import set_env_defaults

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def clear(monkeypatch) -> None:
    for name in (*LAUNCHER_VARS, "DS_ACCELERATOR"):  # restored after the test, set or not
        monkeypatch.delenv(name, raising=False)


def test_a_plain_process_is_a_world_of_one_whose_store_binds_a_port_the_os_picks(monkeypatch):
    clear(monkeypatch)
    set_env_defaults()
    assert {k: os.environ[k] for k in LAUNCHER_VARS} == dict(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"
    )
    dist.init_process_group("gloo")  # env://, as deepspeed.init_distributed calls it
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        assert dist.get_world_size() == 1 and t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("port", ["29500", None])
def test_a_launchers_variables_are_kept(monkeypatch, port):
    env = dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="node-1")
    clear(monkeypatch)
    for k, v in dict(env, MASTER_PORT=port).items():
        if v is not None:
            monkeypatch.setenv(k, v)
    set_env_defaults()
    assert os.environ["RANK"] == "1" and os.environ["WORLD_SIZE"] == "2" and os.environ["MASTER_ADDR"] == "node-1"
    assert os.environ["LOCAL_RANK"] == "1"  # the deepspeed launcher passes it as --local_rank; else the rank
    assert os.environ.get("MASTER_PORT") == port
