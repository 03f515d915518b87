"""Where a run's jobs train (open_executor): in the driver's own process (trainers.in_process_trainer: one at a time
with TensorFlow, or K at a time packed on Keras's JAX backend: train.pack), or on Ray workers (distributed.RayExecutor),
with the host workers their host work runs on (run.host). Each is imported only when asked for: a local run never
imports Ray, a packed one never TensorFlow.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import keras

from ..config import ExecutorConfig, RunConfig
from ..errors import UserError
from .host import host_workers, open_host
from .pipeline import Host, long_lived_frozen
from .trainers import Executor, in_process_trainer

log = logging.getLogger(__name__)


@contextlib.contextmanager
def open_executor(cfg: RunConfig, executor: ExecutorConfig, jobs: int, engine: str,
                  note: Callable[[str], None] = lambda line: None,
                  host_workers: int | str = "auto") -> Iterator[Executor]:
    """The executor of `jobs` jobs, for the engine chosen for this process before Keras was imported (`engine`:
    engine.engine_for's, "jax" or "tensorflow"): in this process (in_process_trainer), or on Ray workers, each with
    the same trainer of its own; `note` is told the pack's size and why, and where the host work runs
    (`host_workers`: run --host-workers, host.host_workers)."""
    if engine != keras.backend.backend():
        raise UserError(f"the run's engine is {engine}, and this process's Keras runs on {keras.backend.backend()}: "
                        f"set KERAS_BACKEND={engine} before Keras is imported (`cryptotrain run` does)")
    if engine == "tensorflow" and cfg.train.pack not in (1, "auto"):
        raise UserError(f"train.pack {cfg.train.pack} trains on Keras's JAX backend, and this process's Keras "
                        f"runs on {engine}: set KERAS_BACKEND=jax before Keras is imported (run --pack does)")
    pack = None  # jobs a Ray worker packs; None: one at a time, with TensorFlow
    if engine == "jax":  # packed: K jobs a step (a job alone is a pack of one)
        from .packing import plan_pack

        plan = plan_pack(cfg.train.pack, jobs, cfg.network, cfg.train, cfg.data.max_rows)
        at_a_time = f"{plan.k} job{'s' * (plan.k > 1)} at a time"
        if executor.kind == "local":
            with _host(host_workers, plan.k, note) as host, long_lived_frozen():
                workers = in_process_trainer(cfg, engine, plan.k, host)
                note(f"packed training on {plan.device}: {at_a_time} ({plan.why}); compiled steps kept in "
                     f"{workers.compilation_cache}")
                yield workers
            return
        note(f"packed training on Ray workers: {at_a_time} on each ({plan.why})")
        pack = plan.k
    else:
        if cfg.train.pack == "auto":
            note("--pack auto: one job at a time, with TensorFlow (packing is for an accelerator JAX sees)")
        from ..model.cudnn import cudnn_report
        from ..model.device import setup

        setup(cfg.train)  # TensorFlow, for this process (and a Ray run's driver), before any model is built
        for layer in cudnn_report(cfg.model):
            if not layer.eligible:
                log.warning("model.layers[%d] (%s) cannot use the fused cuDNN kernel on a GPU: %s",
                            layer.index, layer.kind, "; ".join(layer.blockers))
        if executor.kind == "local":
            with _host(host_workers, 1, note) as host, long_lived_frozen():
                yield in_process_trainer(cfg, engine, 1, host)
            return
    from .distributed import RayExecutor

    with _host(host_workers, executor.workers * (pack or 1), note) as host, \
            RayExecutor(cfg, executor, host, pack) as workers:
        yield workers


@contextlib.contextmanager
def _host(requested: int | str, capacity: int, note: Callable[[str], None]) -> Iterator[Host]:
    """Where the host work of an executor of `capacity` runs (host.host_workers), its workers started now, while the
    model is built; closed with the executor."""
    host = open_host(host_workers(requested, capacity))
    if host.workers > 1:
        note(f"host work (preparing and evaluating jobs) on {host.workers} worker processes")
    try:
        yield host
    finally:
        host.close()
