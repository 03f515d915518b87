"""Whether anything answers at a Ray address: asked by `cryptotrain run --executor ray` before it imports anything
heavy (a wrong --ray-address is said in a second, not after TensorFlow's import), and by the Ray executor, which
also watches its node's raylet and the cluster's GCS with it."""
from __future__ import annotations

import socket

from ..errors import UserError, cause


def reachable(address: str, timeout: float = 5.0) -> None:
    """Raises OSError (ConnectionError, TimeoutError) when nothing answers at a HOST:PORT address ("auto" and
    ray:// are Ray's to find)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    with socket.create_connection((host, int(port)), timeout=timeout):
        pass


def unreachable_cluster(address: str | None, exc: BaseException) -> UserError:
    """The one line for a Ray cluster that cannot be reached (address None: a Ray of this process's own)."""
    where = f"the Ray cluster at {address}" if address else "a local Ray"
    return UserError(f"--ray-address {address}: cannot reach {where} ({cause(exc)}); "
                     "start one with `ray start --head`, or leave --ray-address out for a Ray on this machine")


def check_cluster(address: str | None) -> None:
    """Raises unreachable_cluster's UserError when a given address does not answer (Ray itself would keep trying
    for minutes)."""
    if address is None:
        return
    try:
        reachable(address)
    except OSError as exc:
        raise unreachable_cluster(address, exc) from None
