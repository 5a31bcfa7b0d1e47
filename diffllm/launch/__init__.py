"""Launch: command builders for the deepspeed launcher (hostfile), torchrun (c10d rendezvous) and SLURM (sbatch with
`srun torchrun`, preemption signal and requeue). They build argv lists and scripts; real launchers run them."""
