"""``python -m gtopk.reducers.native`` (``make setup``): build the compiled rounds; a warning,
not a failure, where no compiler works (gTop-k then runs its rounds in Python: the same
results, slower)."""

import sys

from gtopk.reducers.native import build

try:
    print(f"compiled rounds: {build()}")
except RuntimeError as e:
    print(f"warning: {e}; gTop-k's rounds run in Python instead (same results, slower)", file=sys.stderr)
