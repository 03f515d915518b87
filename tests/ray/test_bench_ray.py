"""bench-ray in the suite (as tests/test_benchmarks.py runs every other benchmark): its Ray, started for the run,
listens where the rest of tests/ray's do, in tests/test_ray.py's network namespace."""
from __future__ import annotations

import pytest

from tests.conftest import on_loopback_only
from tests.test_benchmarks import benchmark, written

pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")
pytestmark = [pytest.mark.processes, pytest.mark.bench, on_loopback_only]


def test_bench_ray(tmp_path):
    out = tmp_path / "ray.json"
    benchmark("bench_ray").main(["--only", "BTCUSDT_1h", "--workers", "1", "--epochs", "1", "--rows", "500",
                                 "--json", str(out)])
    results = written(out)
    assert results["local_wall_s"] > 0 and results["ray_wall_s"] > 0 and results["ray_workers_ready_s"] > 0
