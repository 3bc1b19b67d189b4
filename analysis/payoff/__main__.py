"""``python -m analysis.payoff``: see ``analysis.payoff.cli``."""

from analysis.payoff.cli import main

main()
