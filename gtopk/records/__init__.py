"""What a job leaves on disk and how it is reported: the run directory's files, finding
finished jobs, progress and wandb."""
