"""Performance: the network benchmark (alpha-beta calibration), the per-iteration
performance model built on ``gtopk.reducers.costmodel``, and the check of that model's
formulas against the reducers' schedules as they run at any P (``recorder``,
``schedulecheck``)."""
