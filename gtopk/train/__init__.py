"""What runs inside each worker: the training loop, compute (measured or replayed), data,
models, the paper's recipe, model state and checkpoints, fault injection."""
