"""`cryptotrain plan`: what a run would do, without training."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .config import RunConfig
from .jobs import Job


def print_plan(cfg: RunConfig, jobs: list[Job]) -> None:
    from .device import cudnn_report  # TensorFlow is imported only when the plan is printed
    from .flops import flops_per_sample
    from .models import count_params

    n_features = len(cfg.features.columns)
    params = count_params(cfg, n_features)
    console = Console()
    source = cfg.data.source + (" (SYNTHETIC candles)" if cfg.data.source == "synthetic" else "")
    console.print(f"[bold]{cfg.name}[/]: {len(jobs)} jobs, data from {source}, run directory {cfg.run_dir}")
    console.print(f"inputs ({n_features}): {', '.join(cfg.features.columns)}")
    heads = ", ".join(f"{h.name} ({', '.join(h.columns)}) weight {h.weight:g}, {h.loss}" for h in cfg.heads)
    console.print(f"heads: {heads}", markup=False)
    console.print(f"model: {params:,} parameters, {flops_per_sample(cfg, n_features) / 1e6:.1f} MFLOP per sample "
                  f"(forward); batch {cfg.train.batch_size}, up to {cfg.train.epochs} epochs, "
                  f"precision {cfg.train.precision}")

    eligibility = Table(title="recurrent layers: fused cuDNN kernel on a GPU")
    for column in ("layer", "kind", "cuDNN", "why not"):
        eligibility.add_column(column)
    for layer in cudnn_report(cfg):
        eligibility.add_row(f"model.layers[{layer.index}]", layer.kind, "yes" if layer.eligible else "[red]no[/]",
                            "; ".join(layer.blockers))
    console.print(eligibility)

    table = Table(title="jobs")
    for column in ("#", "job", "symbol", "timeframe", "params", "lookback", "horizon", "heads"):
        table.add_column(column, no_wrap=column == "job")
    head_names = ", ".join(h.name for h in cfg.heads)
    for i, job in enumerate(jobs, 1):
        table.add_row(str(i), job.name, job.symbol, job.timeframe, f"{params:,}", str(cfg.window.lookback),
                      str(cfg.window.horizon), head_names)
    console.print(table)
