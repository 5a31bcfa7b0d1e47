"""Checkpoints written, read and planned in one place: `snapshot.py` reads the run directory once at the start of a
launch (`RunSnapshot`), `plan.py` decides over it where the launch starts and what it may not change (`plan_resume`,
`ResumePlan`), `branch.py` is a WSD run's branching (`BranchPlan`), `state.py` what a checkpoint holds besides
DeepSpeed's files (`Resumable`, `TrainState`), `save.py` the DeepSpeed save and load (`CheckpointManager`). The run
directory's files themselves are diffllm/runs.py's (with runfiles.py), shared with evaluation and export."""
