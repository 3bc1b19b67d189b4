"""The last module the workers' fork server imports (``gtopk.run.forkserver.PRELOAD``): it
moves every object imported so far into the garbage collector's permanent generation
(``gc.freeze``), so that a worker's collections never write to those objects' pages, which
then stay shared with the server and the other workers instead of being copied into each.
Imported anywhere else, it only makes those objects immortal to the collector (harmless)."""

import gc

gc.collect()
gc.freeze()
