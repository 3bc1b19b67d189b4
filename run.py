"""Run one job per composed config: ``python run.py [-m] key=value ...``.

Examples:
    python run.py -m reducer=dense,topk,gtopk nodes=4,8,16,32
    python run.py model=vgg16 data=cifar10 mode=train nodes=4 reducer=gtopk density=0.001

Bad input is one line on stderr (exit 2), the command line's checked before Hydra starts
(gtopk.run.overrides), the settings' before any worker does (gtopk.run.checks); a failed
job exits 1 (a sweep goes on and lists its failed jobs at the end; gtopk.run.jobs).
"""

import logging
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig

from gtopk.run.execute import run_job
from gtopk.run.jobs import EXIT_BAD_INPUT
from gtopk.run.overrides import command_line_problem
from gtopk.run.slurm.launcher import register

# hydra/launcher=submitit_slurm: conf/hydra/launcher/submitit_slurm.yaml replaces the plugin's
# config of that name on purpose, with gtopk.run.slurm.launcher's class (registered here)
warnings.filterwarnings("ignore", message="(?s).*validated against ConfigStore schema with the same name")
register()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":
    # a log handler that cannot write (a full disk) drops the record instead of printing a traceback
    logging.raiseExceptions = False
    problem = command_line_problem(sys.argv[1:], Path(__file__).resolve().parent / "conf")
    if problem:  # before Hydra, which creates the run folder first and reports over several lines
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    try:
        main()
    except KeyboardInterrupt:  # the job said where it stopped; no traceback
        sys.exit(130)
