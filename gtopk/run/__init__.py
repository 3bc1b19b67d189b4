"""The one job runner: config checks, run-directory locks and attempts, starting and
supervising worker groups, and the clusters they run on. Only this package starts
worker processes."""
