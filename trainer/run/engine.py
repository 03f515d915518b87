"""Which engine a command's Keras runs on, chosen in this one place before Keras is imported: Keras on TensorFlow
(one job at a time), or on JAX (jobs packed: run.packing; a job alone is a pack of one). Imports neither at import
time: `--help` answers at once."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

from ..errors import UserError

TENSORFLOW_INSTALL = ("pip install 'tensorflow>=2.18,<2.22' (cryptotrain installs it unless installed with --no-deps; "
                      "for NVIDIA GPUs pip install 'cryptotrain[gpu]')")
TENSORFLOW_MISSING = f"TensorFlow is not installed: {TENSORFLOW_INSTALL}"


def import_tensorflow() -> None:
    """Import TensorFlow, and let it look for GPUs, with its native start-up lines (absl's "All log messages before
    absl::InitializeLog()", the oneDNN notice, "failed call to cuInit" on a machine without a GPU) kept off the
    terminal: C++ writes them before any log level applies, and they would tear the live progress display (a GPU
    that is there but unusable is `doctor`'s to explain). A failed import still raises, and says why, after
    stderr is back."""
    if "tensorflow" in sys.modules:
        return
    from ..files import native_stderr_silenced

    try:
        with native_stderr_silenced(), jax_unimported():
            import tensorflow

            tensorflow.config.list_physical_devices()
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow":
            raise
        raise UserError(TENSORFLOW_MISSING) from exc


@contextlib.contextmanager
def jax_unimported() -> Iterator[None]:
    """While TensorFlow imports: an installed JAX not yet imported marked absent (tensorflow_unimported's mirror).
    TensorFlow's TFLite converter imports JAX where it is installed (Colab ships both; the `jax` extra adds it), for
    a conversion no command makes, with a second XLA's set-up: 8.9 -> 7.5 s of CPU for import_tensorflow, six of
    each alternating (2026-11-30, this 2-core Xeon). JAX imports as usual afterwards."""
    left_out = "jax" not in sys.modules
    if left_out:
        sys.modules["jax"] = None
    try:
        yield
    finally:
        if left_out and sys.modules.get("jax", ...) is None:
            del sys.modules["jax"]


def keras_for_a_model() -> None:
    """Keras for a command that builds or runs a model without training it (plan, predict): on TensorFlow where it
    is installed, else on JAX (engine_for's choice for a job alone)."""
    if engine_for(1) == "jax":
        keras_on_jax()
    else:
        import_tensorflow()


def engine_for(pack: int | str) -> str:
    """What a run trains on, decided here: "jax" (Keras on JAX, jobs packed: run.packing) for a K > 1, for auto
    where JAX sees an accelerator, and wherever TensorFlow is not installed (a job alone is a pack of one);
    "tensorflow" (Keras on TensorFlow, one job at a time) otherwise. UserError where neither can run it."""
    jax_missing = "'cryptotrain[jax]' (JAX with CUDA for NVIDIA GPUs: pip install 'jax[cuda12]')"
    if pack not in (1, "auto"):
        if not installed("jax"):
            raise UserError(f"--pack {pack} (train.pack) trains on Keras's JAX backend, and JAX is not installed: "
                            f"pip install {jax_missing}")
        return "jax"
    if not installed("tensorflow"):
        if not installed("jax"):
            raise UserError(f"{TENSORFLOW_MISSING}; or train on Keras's JAX backend: pip install {jax_missing}")
        return "jax"
    if pack == "auto" and installed("jax"):
        return "jax" if on_accelerator() else "tensorflow"
    return "tensorflow"


def on_accelerator() -> bool:
    """Whether JAX sees an accelerator: where packing pays (on a CPU it gains nothing: benchmarks/RESULTS.md,
    bench-pack), so where `--pack auto` packs (engine_for; packing.plan_pack's K)."""
    import jax

    return jax.default_backend() != "cpu"


def keras_on_jax() -> None:
    """Keras's backend for this process, chosen before Keras is imported: JAX, and TensorFlow left unimported
    (tensorflow_unimported). A process whose Keras was imported already (a notebook's, a test's) is left as it is."""
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != "jax":
            raise UserError(f"--pack trains on Keras's JAX backend, and this process's Keras runs on "
                            f"{keras.backend.backend()}: run it in a new process, or with KERAS_BACKEND=jax")
        return
    os.environ["KERAS_BACKEND"] = "jax"
    tensorflow_unimported()


def tensorflow_unimported() -> None:
    """For a process of ours whose Keras runs on JAX: an installed TensorFlow marked absent (None in sys.modules, as
    Python's import system provides). Keras would otherwise import it to seed tf.random and to recognise its types
    when it saves a model: 3-5 s of CPU, and TensorFlow's CUDA set-up, in a process that trains nothing with it. A
    TensorFlow imported already stays."""
    sys.modules.setdefault("tensorflow", None)


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it; ValueError: sys.modules[module] is None
        return False
