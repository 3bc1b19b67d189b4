"""Time to accuracy (``python -m analysis.payoff``, ``make payoff``): iterations to a target from
training runs (``analysis.training``) x time per iteration, measured or modelled (``itertime``);
maps (``maps``), verdicts (``verdict``), the command line (``cli``); the model's t_iter against
measured jobs (``validate``, ``make validate-model``)."""
