"""Run one job per composed config: ``python run.py [-m] key=value ...``.

Examples:
    python run.py -m reducer=dense,topk,gtopk nodes=4,8,16,32
    python run.py model=vgg16 data=cifar10 mode=train nodes=4 reducer=gtopk density=0.001
"""

import hydra
from omegaconf import DictConfig

from gtopk.harness import run_job


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":
    main()
