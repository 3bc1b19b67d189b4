"""``cluster=simulated``'s engines: a training job's P ranks as virtual ranks of one process.

* ``ranks``: ``SimulatedRanks``, the P virtual ranks behind the one training loop's
  interface (``gtopk.train.ranks.Ranks``, driven by ``gtopk.train.loop``), and
  ``run_simulated``, the job's process entry;
* ``worker``: ``VirtualRank`` (what each rank keeps of its own: data shard, RNG stream,
  BatchNorm statistics, reducer state, rows) and ``SimulatedWorker`` (the shared model,
  optimiser and compute; one step of all ranks);
* ``batched`` and ``rankpass``: all ranks' gradients in one vectorised pass
  (``cluster.batched``): vmap, or the one-pass engine;
* ``reduce``: ``reduce_group`` of dense, Top-k and gTop-k (P ranks' ``reduce`` in one
  process, the distributed kernels and summation order);
* ``hooks``: torch's DDP communication hooks (DDP-fp16, PowerSGD) on DDP's buckets,
  their all-reduces paired across the ranks by an in-process process group.

Nothing here imports at package level: ``gtopk.reducers`` and ``baselines`` import
``reduce`` and ``hooks`` (docs/simulated.md).
"""
