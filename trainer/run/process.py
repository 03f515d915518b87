"""How a `run` process sets itself up, before the runner (and Keras) is imported: what an option needs is checked
before any work (Ray, its cluster, tensorboard), a run on Ray moves its driver to a child process
(supervisor.ray_driver_in_a_child), the engine is chosen and its Keras backend imported (engine.engine_for), and
SIGTERM stops the run as Ctrl-C does. cli.py calls it; it prints nothing (`say` does)."""
from __future__ import annotations

import signal
from collections.abc import Callable

from ..config import ExecutorConfig, RunConfig
from ..errors import RAY_MISSING, Terminated, UserError
from .engine import engine_for, import_tensorflow, installed, keras_on_jax
from .supervisor import ray_driver_in_a_child


def set_up_run(cfg: RunConfig, executor: ExecutorConfig, at_close: Callable[[Callable[[], None]], None],
               say: Callable[[str], None]) -> str:
    """This process, for a run of `cfg` on `executor`; the engine chosen ("jax" or "tensorflow": run_config's).
    UserError where an option's package or a cluster is missing, before any work; `at_close`: what registers a call
    once the command's last line is out (click's)."""
    if executor.kind == "ray":
        if not installed("ray"):  # said now, not after seconds of importing TensorFlow
            raise UserError(RAY_MISSING)
        from .reachable import check_cluster

        check_cluster(executor.address)  # likewise
        ray_driver_in_a_child(at_close)
    if cfg.train.tensorboard:  # Keras's callback would fail each job at the end of its first epoch without it
        require("tensorboard", "train.tensorboard (--tensorboard)", "pip install 'tensorboard>=2.16'")
    if (engine := engine_for(cfg.train.pack)) == "jax":
        if cfg.train.pack in (1, "auto") and not installed("tensorflow"):
            say("TensorFlow is not installed: training on Keras's JAX backend")
        keras_on_jax()
    else:
        import_tensorflow()
    signal.signal(signal.SIGTERM, _terminated)  # stop as Ctrl-C does: release the job, say how to resume
    return engine


def require(module: str, option: str, install: str) -> None:
    """An option whose package is missing is refused when the command starts, before any work."""
    if not installed(module):
        raise UserError(f"{option} needs the {module} package, which is not installed: {install}")


def _terminated(signum, frame):
    raise Terminated()
