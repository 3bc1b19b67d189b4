"""Records on disk -> wandb: one run per job (``export``), one per analysis folder (``analyses``),
run ids and ``wandb.init`` (``runs``), reports built from code (``report``), reading offline
run files (``datastore``), whether we are online (``online``)."""
