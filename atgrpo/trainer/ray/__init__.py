"""The Ray backend (``system.backend=ray``, docs/ray.md), in three modules that import one way only:

- ``driver``: ``RayBackend`` (placement groups, routing, the environment workers, weight sync) and the CPU shares
  (``ray_shares``, ``ray_note``). Its top level imports neither torch nor ray: environment workers import it
  (``EnvWorker``) and start in a second.
- ``workers``: the rollout and update actors, ``RemotePolicy`` (the driver's face of a policy whose ``generate``
  runs on its rollout workers) and weight transfer. Imports torch and ray; the driver imports it lazily.
- ``partition``: pure helpers both use; ``faults``: which Ray errors mean a lost worker (``WorkerLost``, ``gather``).

``workers`` never imports ``driver``. The mini-batch plan of a data-parallel update (mini-batches of whole prompt
groups, their shards per rank, the normalisers) is the local update's own: ``trainer.update.plan_minibatches``.
This package's ``__init__`` imports nothing.
"""
