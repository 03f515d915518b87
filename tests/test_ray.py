"""The tests of `run --executor ray` (tests/ray), in a network namespace of their own where nothing but the loopback
is. Ray 2.60 binds its GCS and raylet to every interface, and its agents to the machine's address, whatever node
address it is given: a Ray the tests start anywhere else would be reachable from the network for as long as it runs.
`unshare` (util-linux) makes the namespace, for an unprivileged user too (in a user namespace of its own); there the
tests run as anywhere else, one at a time: a second pytest worker would start a second module head and import the
tests again (206 busy core-seconds against 219 with two, 2026-11-30), while the suite's other workers keep the cores
busy whenever these wait on the processes they start."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import own_session_environ, same_selection

pytestmark = [pytest.mark.train, pytest.mark.processes]  # Ray clusters, and `cryptotrain` processes killed

NAMESPACE = ["unshare", "--net", "--map-root-user"]
# In the new namespace: the loopback up (it starts down; SIOCSIFFLAGS, as `ip link set lo up` does), then pytest
PYTEST_ON_LOOPBACK = """if True:
    import fcntl, os, socket, struct, sys
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack("16sh14x", fcntl.ioctl(probe, 0x8913, struct.pack("16sh14x", b"lo", 0)))[1]
        fcntl.ioctl(probe, 0x8914, struct.pack("16sh14x", b"lo", flags | 1))
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])
"""


def test_the_ray_tests_pass_where_nothing_but_the_loopback_is(tmp_path, pytestconfig):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed (util-linux): the Ray tests need a network namespace of their own")
    refused = subprocess.run([*NAMESPACE, "true"], capture_output=True, text=True)
    if refused.returncode != 0:
        pytest.skip(f"this machine refuses a network namespace ({refused.stderr.strip()[-300:]}): the Ray tests "
                    "need one of their own")
    result = subprocess.run([*NAMESPACE, sys.executable, "-c", PYTEST_ON_LOOPBACK, "-q", "-p", "no:cacheprovider",
                             f"--basetemp={tmp_path / 'ray'}", *same_selection(pytestconfig),
                             str(Path(__file__).parent / "ray")],
                            capture_output=True, text=True, cwd=Path(__file__).parents[1], env=own_session_environ())
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout, result.stdout[-2000:]
