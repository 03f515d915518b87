"""The shrink's significance rule, checked on validation alone (issue 53: a default chosen after test figures).

  python benchmarks/bench_shrink_rule.py RUN_DIR [RUN_DIR ...]
  python benchmarks/bench_skill.py --seeds 1 --keep /tmp/skill
  python benchmarks/bench_shrink_rule.py /tmp/skill/seed-*/run

Each job of a trained run mixes each head with its own persistence by a factor chosen on the validation split
(evaluate.choose_shrink), kept only where its gain is significant (evaluate.significant_gain): its mean two standard
errors above 0 over blocks of a horizon, and **positive in each half** of the split. That last clause was added after
a test figure broke a bound. Here it is checked without the test split: every job's validation forecasts are made
again from its model.keras (the same candles, windows and scalers as its run; the factors its run chose are
recomputed as a check), the validation split is cut in two (a horizon apart, so that no target is in both), and
each rule chooses its factor per head on the first half and is scored on the second, by the MAE skill of the chosen
mix against the head's persistence there:
  - each half:  the rule as shipped;
  - mean only:  the same, without the each-half clause;
  - none:       the factor with the lowest MAE on the first half, significant or not.
Prints per head the median [min, max] of that skill over the jobs, how many jobs fall below -0.005 (the bound issue
50 set each head's skill against its persistence), on how many the rules chose differently there, and on how many
they choose differently on the whole validation split (as a run chooses: no score without the test split); writes JSON
(--json, default benchmarks/results/shrink-rule.json). Imports TensorFlow (Keras's default backend) to load the models.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from rich.console import Console
from rich.table import Table

from trainer.evaluation.evaluate import (
    SHRINK_GRID,
    choose_shrink,
    shrink_errors,
    significant_gain,
)
from trainer.model.models import output_shapes, predict_fixed_batches
from trainer.run.jobdir import JobDir
from trainer.run.jobs import Job
from trainer.run.pipeline import prepare
from trainer.run.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
BOUND = -0.005  # issue 50: each head's skill against its own persistence, on every series


def mean_only(gain: np.ndarray, block: int) -> bool:
    """significant_gain without its each-half clause: the blocks' mean two standard errors above 0."""
    blocks = gain[:len(gain) // block * block].reshape(-1, block).mean(axis=1)
    return len(blocks) >= 2 and bool(blocks.mean() > 0) and \
        bool(blocks.mean() >= 2 * blocks.std(ddof=1) / np.sqrt(len(blocks)))


def job_errors(run_dir: Path, job_dir: Path) -> tuple[dict[str, np.ndarray], int, dict[str, float], dict[str, float]]:
    """Per head, the shrink grid's per-sample errors on the job's validation split (evaluate.shrink_errors), made
    again from its model.keras with its run's config (the same candles, windows, scalers and HAR inputs); its
    horizon; the factors its run chose, and those chosen here again (a check that the forecasts are its run's)."""
    cfg = RunDir.open(run_dir, config_required=True).config
    saved = JobDir(job_dir)
    symbol, timeframe = job_dir.name.rsplit("_", 1)
    model = saved.model()
    windows = prepare(cfg, Job(symbol, timeframe), output_shapes(model, cfg.heads)).windows
    prep, val = windows.preprocessing, windows.val
    outputs = prep.point(predict_fixed_batches(model, val.x))
    recomputed, _ = choose_shrink(outputs, val, prep)
    errors = {head.name: shrink_errors(outputs, val, prep, head) for head in prep.heads}
    return (errors, prep.horizon, {head.name: head.shrink for head in saved.preprocessing().heads},
            {head.name: head.shrink for head in recomputed.heads})


RULES = {"each half": significant_gain, "mean only": mean_only, "none": lambda gain, block: True}


def chosen(errors: np.ndarray, block: int) -> dict[str, int]:
    """Each rule's factor (its index in SHRINK_GRID) chosen on `errors`' samples: the best, where the rule finds its
    gain over persistence (factor 0) significant, else 0."""
    best = int(np.argmin(errors.mean(axis=1)))
    return {name: best if rule(errors[0] - errors[best], block) else 0 for name, rule in RULES.items()}


def halves(errors: np.ndarray, block: int) -> dict[str, tuple[float, float]]:
    """Each rule's factor chosen on the first half of the samples, and its MAE skill against persistence (factor 0)
    on the second half, the halves a horizon (`block`) apart."""
    n = errors.shape[1]
    first, second = errors[:, :n // 2 - block], errors[:, n // 2:]
    skill = (lambda i: 1 - second[i].mean() / second[0].mean()) if second[0].mean() > 0 else (lambda i: 0.0)
    return {name: (float(SHRINK_GRID[i]), float(skill(i))) for name, i in chosen(first, block).items()}


def whole(errors: np.ndarray, block: int) -> dict[str, float]:
    """Each rule's factor chosen on the whole validation split, as a run chooses it."""
    return {name: float(SHRINK_GRID[i]) for name, i in chosen(errors, block).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (a bench-skill --keep DIR's seed-*/run)")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "shrink-rule.json")
    args = parser.parse_args(argv)
    console = Console(stderr=True)

    jobs, mismatched = [], []
    for run_dir in args.runs:
        for job_dir in sorted((run_dir / "jobs").iterdir()):
            errors, horizon, chosen, recomputed = job_errors(run_dir, job_dir)
            if any(abs(chosen[head] - recomputed[head]) > 1e-9 for head in chosen):
                mismatched.append(f"{run_dir.name}/{job_dir.name}: {chosen} != {recomputed}")
            jobs.append({"run": str(run_dir), "job": job_dir.name,
                         "heads": {head: halves(values, horizon) for head, values in errors.items()},
                         "whole": {head: whole(values, horizon) for head, values in errors.items()}})
            console.print(f"{job_dir.name}: " + "; ".join(
                f"{head}: " + ", ".join(f"{rule} {factor:.2f} {skill:+.4f}" for rule, (factor, skill) in rules.items())
                for head, rules in jobs[-1]["heads"].items()))
    if mismatched:  # the forecasts made here are not those the run chose its factors from
        raise SystemExit("the factors chosen again differ from the run's:\n" + "\n".join(mismatched))

    summary = {}
    table = Table(title=f"the shrink's rule on validation alone: chosen on its first half, scored on its second "
                        f"({len(jobs)} jobs)")
    for column in ("head", "rule", "MAE skill vs persistence, median [min, max]", f"below {BOUND}",
                   "factor > 0", "differs from each half", "on the whole split: differs"):
        table.add_column(column)
    for head in jobs[0]["heads"]:
        for rule in RULES:
            skills = [job["heads"][head][rule][1] for job in jobs]
            factors = [job["heads"][head][rule][0] for job in jobs]
            differs = sum(job["heads"][head][rule][0] != job["heads"][head]["each half"][0] for job in jobs)
            differs_whole = sum(job["whole"][head][rule] != job["whole"][head]["each half"] for job in jobs)
            summary.setdefault(head, {})[rule] = {
                "median": statistics.median(skills), "min": min(skills), "max": max(skills),
                "below_bound": sum(skill < BOUND for skill in skills), "shrunk": sum(f > 0 for f in factors),
                "differs_from_each_half": differs, "differs_from_each_half_on_the_whole_split": differs_whole}
            table.add_row(head, rule, f"{statistics.median(skills):+.4f} [{min(skills):+.4f}, {max(skills):+.4f}]",
                          str(summary[head][rule]["below_bound"]), str(summary[head][rule]["shrunk"]), str(differs),
                          str(differs_whole))
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "runs": [str(run) for run in args.runs], "bound": BOUND,
        "halves": "the validation split's first half, less a horizon; its second half", "summary": summary,
        "jobs": jobs}, indent=1))
    console.print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
