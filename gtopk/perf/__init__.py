"""Performance: the network benchmark (alpha-beta calibration) and the per-iteration
performance model built on ``gtopk.reducers.costmodel``."""
