"""``python -m analysis.reproduce TARGET ...`` (the Makefile's ``$(REPRODUCE)``): ``cli.main``."""

from analysis.reproduce.cli import main

main()
