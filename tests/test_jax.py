"""The tests of what runs on Keras's JAX backend (tests/jax: packed training), in a process of their own: a process's
Keras backend is chosen once, and this one's is TensorFlow."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import own_session_environ, same_selection

pytestmark = [pytest.mark.train, pytest.mark.processes]  # a JAX process of its own


# XLA on the CPU runs each op on every core by default: beside the suite's other workers (each given its share of the
# cores, conftest.py), one thread, as the TensorFlow workers' ops get theirs
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def compilation_cache(directory: Path) -> dict[str, str]:
    """JAX's persistent compilation cache in `directory`, for one process or several in turn (not at once): the
    tests build the same small models again and again (a job alone, then packed), and XLA compiles each anew unless
    it finds the same computation there (a quarter of tests/jax's CPU time)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.2"}


def test_the_jax_backend_tests_pass(tmp_path, pytestconfig):
    """All of tests/jax in one process: its start (Keras, JAX, pytest: ~5 s of CPU) is paid once, and a computation
    one file compiled is in memory for the next (2026-11-29, this 2-core Xeon: 80 s, against 235 s in the suite for
    a process a file)."""
    pytest.importorskip("jax")  # the dev extra installs it; the `jax` extra for users
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *same_selection(pytestconfig), str(Path(__file__).parent / "jax")],
                            env=own_session_environ(KERAS_BACKEND="jax", XLA_FLAGS=XLA_ONE_THREAD,
                                                    **compilation_cache(tmp_path / "xla")),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout, result.stdout[-2000:]
