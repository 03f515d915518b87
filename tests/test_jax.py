"""The tests of what runs on Keras's JAX backend (tests/jax: packed training), in a process of their own: a process's
Keras backend is chosen once, and this one's is TensorFlow."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train


def test_the_jax_backend_tests_pass():
    pytest.importorskip("jax")  # the dev extra installs it; the `jax` extra for users
    tests = Path(__file__).parent / "jax"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                            env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout, result.stdout[-2000:]
