"""Trainer configs: token arithmetic, budgets that must divide exactly, errors that name the key, the generated
DeepSpeed config, and the shipped config groups."""

from __future__ import annotations

import pytest

from diffllm.config import build, compose
from diffllm.train.config import OptimConfig, TrainerConfig, plan_budget
from diffllm.train.engine import deepspeed_config


@pytest.mark.parametrize("tokens, batch", [("1_048_576", "1_024"), ("1.048576M", "1.024K"), (2**20, 1024)])
def test_budget_counts_go_through_the_one_parser(tokens, batch):
    b = plan_budget(TrainerConfig(tokens=tokens, global_batch_tokens=batch, micro_batch_size=1), 1024, 1)
    assert (b.tokens, b.global_batch_tokens, b.steps) == (2**20, 1024, 1024)


@pytest.mark.parametrize(
    "key, bad, match",
    [
        ("tokens", "1.0000005M", r"'1.0000005M' is not a whole number \(1000000.5\)$"),
        ("tokens", "ten", "expected a count"),
        ("global_batch_tokens", 0, "must be positive"),
    ],
)
def test_budget_refuses_bad_counts_naming_the_key(key, bad, match):
    with pytest.raises(ValueError, match=rf"^trainer\.{key}: .*{match}"):
        plan_budget(TrainerConfig(**{key: bad}), 1024, 1)


def test_budget_sets_grad_accum_and_steps():
    t = TrainerConfig(tokens=2**23, global_batch_tokens=2**20, micro_batch_size=8)
    b = plan_budget(t, 2048, 16)
    assert (b.grad_accum, b.steps, b.sequences_per_step, b.tokens) == (4, 8, 512, 2**23)


def test_budget_errors_name_the_keys_and_the_fix():
    t = TrainerConfig(tokens=2**20, global_batch_tokens=3000, micro_batch_size=4)
    with pytest.raises(ValueError) as e:
        plan_budget(t, 64, 2)
    msg = str(e.value)
    assert msg.startswith("trainer.global_batch_tokens=3000") and "trainer.micro_batch_size" in msg
    assert "data.seq_len" in msg and "use 2560 or 3072" in msg
    t = TrainerConfig(tokens=10**6, global_batch_tokens=1024, micro_batch_size=4)
    with pytest.raises(ValueError, match=r"^trainer\.tokens=1000000: not a whole number.*1000448.*round_tokens"):
        plan_budget(t, 64, 2)


def test_budget_suggestions_never_repeat_a_number_and_point_clusters_to_paper_scaling():
    """The CPU trainer's 4,096-token batch on 4 nodes x 8 ranks said `use 65536 or 65536`."""
    cpu = build(TrainerConfig, compose("train", ["model=diff-6.8b"]).trainer, "trainer")
    with pytest.raises(ValueError) as e:
        plan_budget(cpu, 256, 32)
    assert str(e.value) == (
        "trainer.global_batch_tokens=4096 is less than one micro-batch on every rank: trainer.micro_batch_size x "
        "data.seq_len x world size = 8 x 256 x 32 = 65536; use 65536 or a multiple of it, or change "
        "trainer.micro_batch_size (the CPU trainer defaults suit one machine; a paper-size model on a cluster wants "
        "trainer=paper-scaling)"
    )
    paper = build(TrainerConfig, compose("train", ["model=diff-6.8b", "trainer=paper-scaling"]).trainer, "trainer")
    assert plan_budget(paper, 256, 32).grad_accum == 16  # 262,144 tokens = 16 x micro-batch 2 x 256 x 32 ranks
    with pytest.raises(ValueError, match=r"; use 1024 \(the run stops"):
        plan_budget(TrainerConfig(tokens=1000, global_batch_tokens=1024, micro_batch_size=4), 64, 2)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"zero_stage": 4}, "trainer.zero_stage"),
        ({"offload_params": True, "zero_stage": 2}, "trainer.offload_params"),
        ({"precision": "fp16"}, "trainer.precision"),
        ({"micro_batch_size": 0}, "trainer.micro_batch_size"),
    ],
)
def test_trainer_validation_names_the_key(override, key):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        TrainerConfig(**override).validate()


def test_optim_validation_and_unknown_keys():
    with pytest.raises(ValueError, match=r"^optim\.schedule: "):
        OptimConfig(schedule="step").validate()
    with pytest.raises(ValueError, match=r"^optim\.min_lr: "):
        OptimConfig(lr=1e-4, min_lr=1e-3).validate()
    for lr in (-1e-3, float("nan")):  # the lr itself is named, not min_lr (issue 31)
        with pytest.raises(ValueError, match=rf"^optim\.lr: must be >= 0 \(the peak learning rate\), got {lr}$"):
            OptimConfig(lr=lr).validate()
    OptimConfig(lr=0.0, min_lr=0.0).validate()  # lr 0: weights that must not move (tests/train/test_init_from.py)
    with pytest.raises(ValueError, match=r"^trainer\.tokenz: unknown key"):
        build(TrainerConfig, {"tokenz": 5}, "trainer")
    with pytest.raises(ValueError, match=r"^trainer\.val_tokens: must be >= 1 \(null: the whole held-out set\), got 0"):
        build(TrainerConfig, {"val_tokens": 0}, "trainer").validate()


def test_deepspeed_config_from_ours():
    t = TrainerConfig(
        tokens=2**16,
        global_batch_tokens=2**13,
        micro_batch_size=4,
        zero_stage=3,
        offload_optimizer=True,
        offload_params=True,
        deepspeed={"zero_optimization": {"reduce_bucket_size": 1000}, "steps_per_print": 7},
    )
    o = OptimConfig(grad_clip=0.5)
    ds = deepspeed_config(t, o, plan_budget(t, 256, 2), "bf16")
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        32,
        4,
        4,
    )
    assert ds["gradient_clipping"] == 0.5 and ds["bf16"] == {"enabled": True}
    z = ds["zero_optimization"]
    assert z["stage"] == 3 and z["reduce_bucket_size"] == 1000  # the raw keys merge, they do not replace
    assert z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu"
    assert ds["steps_per_print"] == 7 and ds["zero_allow_untested_optimizer"] is True
    assert ds["checkpoint"] == {"load_universal": False}


def test_shipped_configs_compose_and_their_budgets_divide():
    """make train's defaults on 1 or 2 ranks, and the paper presets at their usual GPU counts."""
    cfg = compose("train")
    assert cfg.model.name == "diff-tiny" and cfg.data.name == "shakespeare" and cfg.trainer.resume == "auto"
    assert cfg.run_dir == "runs/diff-tiny"
    t = build(TrainerConfig, cfg.trainer, "trainer")
    for ws in (1, 2):
        plan_budget(t, cfg.data.seq_len, ws)
    for group, seq, sizes in (("paper-3b", 4096, (8, 64, 256)), ("paper-scaling", 2048, (8, 16))):
        c = compose("train", [f"trainer={group}", f"optim={group}"])
        t = build(TrainerConfig, c.trainer, "trainer")
        o = build(OptimConfig, c.optim, "optim")
        o.validate()
        for ws in sizes:
            plan_budget(t, seq, ws)
    assert (
        plan_budget(build(TrainerConfig, compose("train", ["trainer=paper-scaling"]).trainer, "t"), 2048, 8).steps
        == 40000
    )


def test_round_tokens_rounds_up_to_whole_steps_with_a_note():
    t = TrainerConfig(tokens=10**6, global_batch_tokens=1024, micro_batch_size=4, round_tokens=True)
    b = plan_budget(t, 64, 2)
    assert (b.tokens, b.steps, b.requested_tokens) == (977 * 1024, 977, 10**6)
    assert b.note == (
        "trainer.tokens=1000000 rounded up to 1000448 = 977 whole steps of 1024 tokens (trainer.round_tokens=true)"
    )
    assert (
        plan_budget(
            TrainerConfig(tokens=2048, global_batch_tokens=1024, micro_batch_size=4, round_tokens=True), 64, 2
        ).note
        is None
    )


def test_the_roles_of_keys_on_resume_are_field_metadata():
    """What the four hand-kept lists said (operational keys, those a branch may change, the model keys that are not
    its architecture) is read from the dataclasses' field metadata."""
    from diffllm.config import compose
    from diffllm.model import ModelConfig
    from diffllm.train.checkpoints.plan import keys_with
    from diffllm.train.config import TrainConfig

    cfg = TrainConfig.from_hydra(compose("train", []))
    operational = {
        "run_dir",
        "trainer.resume",
        "trainer.allow_changes",
        "trainer.log_every",
        "trainer.diagnostics",
        "trainer.save_every_steps",
        "trainer.save_every_minutes",
        "trainer.keep_last",
        "trainer.dist_timeout_minutes",
        "trainer.round_tokens",
        "trainer.eval",
        "trainer.stall_timeout_s",
        "trainer.faults.stall_at_steps",
        "trainer.faults.step_delay_s",
        "trainer.branch_budgets",
        "trainer.val_batch_size",
        "trainer.compile",
        "trainer.activation_checkpointing",
        "model.attn_backend",
        "data.num_workers",
        "data.worker_timeout_s",
        "data.on_bad_record",  # a run stopped by a malformed record resumes with data.on_bad_record=skip
        "data.tokenizer.path",
        "logging",
    }
    assert set(keys_with(cfg, "operational")) == operational
    assert set(keys_with(cfg, "operational", "branch")) - operational == {
        "trainer.tokens",
        "trainer.branch_from",
        "trainer.val_every",
        "trainer.val_batches",
        "trainer.val_tokens",  # a branch may validate on another share of the held-out set
        "trainer.zero_stage",
        "trainer.offload_optimizer",
        "trainer.offload_params",
        "trainer.micro_batch_size",
        "trainer.max_nonfinite_in_a_row",
    }
    assert set(keys_with(ModelConfig(), "kept")) == {"attn_backend", "max_seq_len", "init_from"}
    assert set(keys_with(ModelConfig(), "kept", "label")) == {"name", "attn_backend", "max_seq_len", "init_from"}


def test_the_resolved_config_is_derived_from_the_typed_one():
    """TrainConfig is frozen; a changed group is a new TrainConfig whose `resolved` (what config.yaml and the
    checkpoints record) says so."""
    import dataclasses

    from diffllm.config import compose
    from diffllm.train.config import TrainConfig

    cfg = TrainConfig.from_hydra(compose("train", ["data.tokenizer.vocab_size=1024"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model = cfg.model
    trained = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=1024))
    assert trained.resolved["model"]["vocab_size"] == 1024 and cfg.resolved["model"]["vocab_size"] == 8192
    assert trained.resolved["data"]["tokenizer"]["vocab_size"] == 1024 and trained.resolved["seed"] == cfg.seed


def test_a_window_longer_than_the_model_is_refused_with_the_config():
    """Issue 31: data.seq_len above model.max_seq_len failed only at the first forward, after run_dir was written
    (and passed `launch --dry-run`, which builds the same TrainConfig)."""
    from diffllm.train.config import TrainConfig

    with pytest.raises(ValueError) as e:
        TrainConfig.from_hydra(compose("train", ["model=diff-830m", "data.seq_len=4096"]))
    assert str(e.value) == (
        "data.seq_len=4096: longer than model.max_seq_len=2048 (the model's context); use data.seq_len <= 2048, or "
        "set model.max_seq_len"
    )
    assert TrainConfig.from_hydra(compose("train", ["model=diff-830m", "data.seq_len=2048"])).data.seq_len == 2048


def test_schedule_changes_name_each_key_and_compare_counts_as_numbers():
    from diffllm.train.checkpoints.plan import schedule_changes

    saved = {"optim": {"lr": 3e-3, "betas": [0.9, 0.95]}, "trainer": {"tokens": "8K", "global_batch_tokens": 1024}}
    same = {
        "optim": {"lr": 3e-3, "betas": [0.9, 0.95], "new_key": 1},
        "trainer": {"tokens": 8000, "global_batch_tokens": "1.024K"},
    }
    assert schedule_changes(saved, same, at_budget=False) == []  # a key the checkpoint's diffllm lacked is no change
    more = {"optim": {"lr": 1e-3, "betas": [0.9, 0.99]}, "trainer": {"tokens": "16K", "global_batch_tokens": 1024}}
    assert schedule_changes(saved, more, at_budget=False) == [
        "optim.betas ([0.9, 0.95] -> [0.9, 0.99])",
        "optim.lr (0.003 -> 0.001)",
        "trainer.tokens ('8K' -> '16K')",
    ]
    # a checkpoint at its own budget (a finished run) trains on to a larger one; a smaller one is still a change
    assert schedule_changes(saved, more, at_budget=True)[-1] == "optim.lr (0.003 -> 0.001)"
    less = {**more, "trainer": {"tokens": "4K", "global_batch_tokens": 1024}}
    assert schedule_changes(saved, less, at_budget=True)[-1] == "trainer.tokens ('8K' -> '4K')"
