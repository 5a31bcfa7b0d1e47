"""A roll call before a multi-node torchrun: every `diffllm launch --node-rank R` checks in at master_addr:master_port
(node rank 0 hosts a TCPStore there) and waits for the others, so that a node which never comes is named by its rank
in one line, and a port already taken on the master is reported before torchrun starts. Then node 0 closes the store
and torchrun's own c10d rendezvous takes the same port."""

from __future__ import annotations

import time
from datetime import timedelta

from ..errors import UserError
from .argv import LaunchConfig

_POLL_S = 0.5


def roll_call(cfg: LaunchConfig) -> None:
    """Return once all `cfg.nodes` nodes have checked in; raise ValueError naming the missing node ranks after
    `cfg.rdzv_timeout_s`, or the busy port."""
    from torch.distributed import TCPStore

    where = f"{cfg.master_addr}:{cfg.master_port}"
    host = cfg.node_rank == 0
    deadline = time.monotonic() + cfg.rdzv_timeout_s
    try:
        store = TCPStore(
            cfg.master_addr,
            cfg.master_port,
            is_master=host,
            wait_for_workers=False,
            timeout=timedelta(seconds=cfg.rdzv_timeout_s),
            use_libuv=False,
        )
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/DistNetworkError with long texts
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if host and ("in use" in text.lower() or "errno: 98" in text.lower()):
            raise UserError(
                f"rendezvous port {cfg.master_port} on {cfg.master_addr} is already in use (another "
                f"run, or a leftover process?): pick a free one with --master-port"
            ) from None
        if host:
            raise UserError(
                f"node rank 0 cannot host the rendezvous at {where}: {text} (is --master-addr "
                f"{cfg.master_addr} this machine?)"
            ) from None
        raise UserError(
            f"node rank {cfg.node_rank}: could not reach the rendezvous at {where} within "
            f"{cfg.rdzv_timeout_s} s (node rank 0 not started there?): {text}"
        ) from None
    store.set(f"node{cfg.node_rank}", "here")
    ranks = [f"node{r}" for r in range(cfg.nodes)]
    while not store.check(ranks):
        if time.monotonic() > deadline:
            missing = [r for r in range(cfg.nodes) if not store.check([f"node{r}"])]
            raise UserError(
                f"rendezvous at {where} timed out after {cfg.rdzv_timeout_s} s: node rank(s) "
                f"{', '.join(map(str, missing))} never joined ({cfg.nodes - len(missing)} of "
                f"{cfg.nodes} nodes did; start `diffllm launch ... --node-rank "
                f"{missing[0]}` there, or raise --rdzv-timeout-s)"
            )
        time.sleep(_POLL_S)
    if host:  # keep the store up until every node has seen the full roll, then free the port for torchrun
        store.add("seen", 1)
        while int(store.add("seen", 0)) < cfg.nodes:
            time.sleep(_POLL_S / 5)
    else:
        store.add("seen", 1)
    del store
