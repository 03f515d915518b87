"""`cryptotrain plan`: what a run would do, without training."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import RunConfig
from .jobs import Job

if TYPE_CHECKING:
    from ..model.cudnn import LayerEligibility


@dataclass(frozen=True)
class Plan:
    """What a run of `cfg` over `jobs` would train: every job has the same model."""
    cfg: RunConfig
    jobs: list[Job]
    n_features: int
    params: int  # the model's parameters
    flops_per_sample: float  # forward pass
    layers: list[LayerEligibility]  # each recurrent layer: fused cuDNN kernel on a GPU, or what keeps it off


def make_plan(cfg: RunConfig, jobs: list[Job]) -> Plan:
    """The plan of a run, without training (builds the model once, to count its parameters)."""
    from ..model.cudnn import cudnn_report
    from ..model.flops import flops_per_sample
    from ..model.models import count_params

    network = cfg.network
    return Plan(cfg, list(jobs), network.n_features, count_params(network), flops_per_sample(network),
                cudnn_report(cfg.model))
