"""SLURM: the sweep launcher (``hydra/launcher=submitit_slurm``, ``launcher.py``), a
single-node test cluster on this machine (``python -m gtopk.run.slurm.local up|down|status``)
and the batch script for jobs that span nodes (``torchrun.sbatch``: srun + torchrun).
docs/distributed.md shows how they are used."""

from pathlib import Path

#: the batch script for one job over several SLURM nodes (one torchrun per node)
TORCHRUN_SBATCH = Path(__file__).resolve().parent / "torchrun.sbatch"
