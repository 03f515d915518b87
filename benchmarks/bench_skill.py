"""Are the models worth having? The bundled family, trained on every real series, scored on what is predictable.

  make bench-skill
  python benchmarks/bench_skill.py --family v7 --epochs 4 --only 'BTC*'
  python benchmarks/bench_skill.py --set heads.0.loss=mse      # a variant: any `cryptotrain run --set`
  python benchmarks/bench_skill.py --shipped --epochs 12 --seeds 1 --only 'BTCUSDT_*'   # V7 at full size

The family's config as shipped (configs/<family>.yaml: its features, window, heads, losses, layer kinds),
scaled down only in units (128 -> 16, 64 -> 16, 32 -> 8), epochs (--epochs, early stopping patience 2) and
batch size (64) - the miniature; --shipped: at full size, only its epochs capped - is trained with
`cryptotrain run` on every series in ../shared/data/ohlcv (or --data). Per series,
on the held-out chronological test split, like with like: the network's forecasts are put on their level on
validation (per step, the factor with the lowest MAE there, and QLIKE's for the range's root mean square), and the
bar is HAR + time of day put on its level the same way (har_tod_level); HAR as fitted on the train split is shown
beside, labelled "as fitted", and HAR-X (HAR + time of day with the network's extra inputs, linear, on its validation
level: what the network adds beyond a linear model of the same information). For the network's own forecast, and for
what users get (the network combined with HAR-X and HAR, the weights chosen on validation):
  - the log range ln(high / low) of the next candle: QLIKE skill (of the root-mean-square range) and MAE skill (of
    the median);
  - the high excursion ln(high / last close) and the low excursion ln(last close / low) together: MAE skill of
    their sum of MAEs;
  - the mean range of the next `horizon` candles: QLIKE skill (every forecast put on its validation level);
  - whether the network's correction is used in what users get (its weight > 0 at the next candle);
  - the 80 % interval of the close's return, the conformal method's (evaluation.interval.method): coverage overall
    and by tercile of the forecast volatility. The method gives as much around any forecast (bench-baselines:
    around "no change"): the figure is the method's, not the network's;
  - the close over every horizon step: skill vs persistence (after the validation-chosen shrink);
  - every head (ohlc, bb, volatility): its MAE skill against its own persistence (each column's last value, over its
    columns and steps), served as a validation-chosen mix of the network and that persistence, and the mix.
The same three figures of the next candle on the validation split (the network's own against HAR on its level there,
both put on their level there alike: results.ValidationSkill) are what a choice among variants is made on: compare
variants (--set) by them, never by the test split's.
Targets (issue 28, the network's own forecast against the bar): range QLIKE median >= +0.03, positive on >= 40 of
48, none below -0.03; range MAE median >= +0.01, none below -0.01; high + low MAE median >= 0, none below -0.01;
next-10 mean range QLIKE median >= +0.02; the interval covers 77-83 % on >= 46 of 48 series and every tercile within
5 points of 80 % on >= 43 of 48; the close's skill >= -0.005 on every series; every head's median skill against its
own persistence >= -0.005 (issue 50; the worst series reported). Prints the table and the overall figures; writes
JSON (--json; default benchmarks/results/skill.json, skill-elsewhere.json with --elsewhere).
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

import yaml
from rich.console import Console
from rich.table import Table

from trainer.config import load_config
from trainer.evaluation.baselines import Baseline
from trainer.evaluation.results import BAR, BAR_RMS, JobMetrics
from trainer.report.console import JobProgress
from trainer.run.artifacts import jobs_dir
from trainer.run.jobdir import JobDir
from trainer.run.jobs import make_jobs
from trainer.run.runner import run_config

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SHARED_OHLCV = (REPO.parent / "shared" / "data" / "ohlcv").resolve()
# Candles outside the 48 (BTC, ETH, SOL of 2024, freqtrade's files as they are): --elsewhere checks the figures there
SHARED_FREQTRADE = (REPO.parent / "shared" / "data" / "freqtrade" / "binance").resolve()
RESULTS = BENCH_DIR / "results" / "skill.json"  # skill-elsewhere.json with --elsewhere
NARROW = {256: 16, 128: 16, 64: 16, 32: 8}  # the family's units -> these
COVERAGE, TERCILE_TOLERANCE, CLOSE_WORST = (0.77, 0.83), 0.05, -0.005
# figure -> (median at least, worst at least, positive on at least this share of series) for the network's own
TARGETS = {"range_qlike": (0.03, -0.03, 40 / 48), "range_mae": (0.01, -0.01, None),
           "high_low_mae": (0.0, -0.01, None), "mean_range_qlike": (0.02, None, None)}
COVERAGE_SHARE, TERCILE_SHARE = 46 / 48, 43 / 48
FIGURES = ("range_qlike", "range_mae", "high_low_mae", "mean_range_qlike")
# Also against HAR + time of day as fitted on the train split, beside (the mean range's QLIKE puts every forecast on
# its validation level already); and on the validation split, where variants are compared
FITTED_FIGURES = VALIDATION_FIGURES = HARX_FIGURES = ("range_qlike", "range_mae", "high_low_mae")
SIGNIFICANCE = 0.05  # the Diebold-Mariano test's level
HARX_TARGET = 0.01  # issue 53: the network against HAR-X (a linear model given the same inputs), range QLIKE median
LABELS = {"range_qlike": "range QLIKE", "range_mae": "range MAE", "high_low_mae": "high + low MAE",
          "mean_range_qlike": "mean range QLIKE"}


def bench_config(family: str, symbols: list[str], timeframes: list[str], epochs: int, run_dir: Path,
                 cache_dir: Path, corpus: Path, elsewhere: bool = False, shipped: bool = False) -> dict:
    """configs/<family>.yaml with the series of `corpus` here, fewer units, epochs and a larger batch: nothing else
    changed. `shipped`: the family as shipped (its units, batch size and patience), only its epochs capped."""
    config = yaml.safe_load((REPO / "configs" / f"{family}.yaml").read_text())
    layers = config["model"]["layers"] if shipped else \
        [{**layer, "units": NARROW.get(layer["units"], layer["units"])} if "units" in layer else layer
         for layer in config["model"]["layers"]]
    train = {**config["train"], "epochs": epochs}
    if not shipped:
        train |= {"batch_size": 64, "early_stopping": {**config["train"].get("early_stopping", {}), "patience": 2},
                  "reduce_lr": {**config["train"].get("reduce_lr", {}), "patience": 1}}
    return {
        **config, "name": f"bench_skill_{family}", "output_dir": str(run_dir), "cache_dir": str(cache_dir),
        "data": {**({"source": "freqtrade", "freqtrade": {"path": str(corpus)}} if elsewhere else
                    {"source": "local", "local": {"path": str(corpus), "pattern": "{symbol}_{timeframe}.csv.gz"}}),
                 "symbols": symbols, "timeframes": timeframes},
        "model": {**config["model"], "layers": layers}, "train": train,
    }


def series_of(pattern: str, corpus: Path, elsewhere: bool = False) -> list[str]:
    """SYMBOL_TIMEFRAME of every series (BTCUSDT_1h) of the corpus (CSV files, or, elsewhere, freqtrade's files)
    matching `pattern`."""
    names = [p.name.removesuffix(".feather").replace("_", "").replace("-", "_")
             for p in corpus.glob("*.feather")] if elsewhere else \
        [p.name.removesuffix(".csv.gz") for p in corpus.glob("*.csv.gz")]
    return sorted(name for name in names if fnmatch.fnmatch(name, pattern))


def train(family: str, series: list[str], epochs: int, scratch: Path, overrides: list[str], corpus: Path,
          elsewhere: bool = False, shipped: bool = False) -> tuple[dict[str, dict], float]:
    """Trains the series as `cryptotrain run` does (run.runner.run_config, in this process); job name ->
    metrics.json, and the wall time."""
    symbols = sorted({s.split("_")[0] for s in series})
    timeframes = sorted({s.split("_")[1] for s in series})
    config = scratch / f"{family}.yaml"
    run_dir = scratch / "run"
    config.write_text(yaml.safe_dump(bench_config(family, symbols, timeframes, epochs, run_dir, scratch / "cache",
                                                  corpus, elsewhere, shipped), sort_keys=False))
    started = time.perf_counter()
    cfg = load_config(config, overrides)
    # Only the series that exist (not every symbol has both timeframes); a failed job shows in the table.
    run_config(cfg, make_jobs(cfg, only=tuple(series)), JobProgress(), engine="tensorflow")
    seconds = time.perf_counter() - started
    found = {}
    for name in series:
        job = JobDir(jobs_dir(run_dir) / name)
        if job.is_job():
            found[name] = job.metrics()
    return found, seconds


def row(metrics: JobMetrics | None) -> dict | None:
    """The figures of one job; None when it did not finish or has no candle head. `{figure}_network`: the network's
    own forecast vs HAR + time of day on its validation level (the bar, like with like); `{figure}_served`: what
    users get, against the same; `{figure}_fitted`: the network's own vs HAR as fitted on the train split
    (FITTED_FIGURES); `{figure}_validation`: the network's own vs the bar on the validation split
    (VALIDATION_FIGURES)."""
    if metrics is None or metrics.candles is None:
        return None
    candles, interval = metrics.candles, metrics.candles.interval
    high, low, range_ = candles.high, candles.low, candles.range

    def high_low(who: str, baseline: Baseline) -> float:
        mae = sum((q.network if who == "network" else q).mae for q in (high, low))
        return 1 - mae / (high.baselines[baseline].mae + low.baselines[baseline].mae)

    mean_range = candles.mean_range
    return {
        "range_qlike_network": range_.network_qlike_skill[BAR_RMS], "range_qlike_served": range_.qlike_skill[BAR_RMS],
        "range_qlike_fitted": range_.network_qlike_skill[Baseline.HAR_TOD_RMS],
        "range_qlike_harx": range_.network_qlike_skill.get(Baseline.HARX_LEVEL_RMS),
        "range_mae_harx": range_.network_skill.get(Baseline.HARX_LEVEL),
        "high_low_mae_harx": high_low("network", Baseline.HARX_LEVEL) if Baseline.HARX_LEVEL in high.baselines
        else None,
        # the Diebold-Mariano test of the network alone against the bar and HAR-X, two-sided p (None: not tested)
        "range_qlike_p_bar": (range_.network_qlike_p or {}).get(BAR_RMS),
        "range_qlike_p_harx": (range_.network_qlike_p or {}).get(Baseline.HARX_LEVEL_RMS),
        "range_mae_p_bar": range_.network_p.get(BAR), "range_mae_p_harx": range_.network_p.get(Baseline.HARX_LEVEL),
        "range_mae_network": range_.network_skill[BAR], "range_mae_served": range_.skill[BAR],
        "range_mae_fitted": range_.network_skill[Baseline.HAR_TOD],
        "high_low_mae_network": high_low("network", BAR), "high_low_mae_served": high_low("served", BAR),
        "high_low_mae_fitted": high_low("network", Baseline.HAR_TOD),
        "mean_range_qlike_network": mean_range and mean_range.network_qlike_skill,
        "mean_range_qlike_served": mean_range and mean_range.qlike_skill,
        **{f"{figure}_validation": value for figure, value in candles.validation.model_dump().items()},
        "correction_used": max(q.network_weight[0] for q in (high, low, range_)) > 0,
        "interval_method": interval.method, "coverage": interval.coverage,
        "coverage_by_tercile": interval.coverage_by_tercile,
        "close_skill": metrics.heads[metrics.headline.head].close.skill, "shrink": metrics.headline.shrink,
        "head_skill": {name: scores.skill for name, scores in metrics.heads.items()},
        "head_shrink": {name: scores.shrink for name, scores in metrics.heads.items()},
        "epochs": metrics.epochs_run,
    }


def overall(rows: dict[str, dict | None], n_series: int) -> dict:
    done = [r for r in rows.values() if r is not None]
    if not done:
        return {"jobs": 0}

    def spread(key: str) -> dict | None:
        values = [r[key] for r in done if r[key] is not None]
        return None if not values else {"median": statistics.median(values), "min": min(values), "max": max(values),
                                        "above_0": sum(v > 0 for v in values), "n": len(values)}

    figures = {"jobs": len(done), **{f"{f}_{who}": spread(f"{f}_{who}") for f in FIGURES
                                     for who in ("network", "served")},
               **{f"{f}_fitted": spread(f"{f}_fitted") for f in FITTED_FIGURES},
               **{f"{f}_harx": spread(f"{f}_harx") for f in HARX_FIGURES},
               **{f"{f}_validation": spread(f"{f}_validation") for f in VALIDATION_FIGURES},
               "coverage": spread("coverage"), "close_skill": spread("close_skill"),
               "correction_used": sum(r["correction_used"] for r in done), "heads": head_figures(done),
               "significant": significant(done)}
    covered = [COVERAGE[0] <= r["coverage"] <= COVERAGE[1] for r in done]
    terciles = [all(abs(c - 0.8) <= TERCILE_TOLERANCE for c in r["coverage_by_tercile"]) for r in done]
    figures["coverage_in_range"] = sum(covered)
    figures["terciles_within_tolerance"] = sum(terciles)
    figures["median_coverage_by_tercile"] = [statistics.median(r["coverage_by_tercile"][i] for r in done)
                                             for i in range(3)]
    targets = {"all series finished": len(done) == n_series}
    for figure, (median, worst, positive) in TARGETS.items():
        got = figures[f"{figure}_network"]
        if got is None:
            targets[f"{LABELS[figure]}: measured"] = False
            continue
        who = "the network alone vs HAR on its level"
        targets[f"{LABELS[figure]}, {who}: median >= {median:+.2f}"] = got["median"] >= median
        if worst is not None:
            targets[f"{LABELS[figure]}, {who}: none below {worst:+.2f}"] = got["min"] >= worst
        if positive is not None:
            targets[f"{LABELS[figure]}, {who}: positive on >= {positive:.0%} of series"] = \
                got["above_0"] >= positive * n_series
    targets[f"80 % interval (the conformal method's) covers {COVERAGE[0]:.0%}-{COVERAGE[1]:.0%} on >= "
            f"{COVERAGE_SHARE:.0%} of series"] = sum(covered) >= COVERAGE_SHARE * n_series
    targets[f"each tercile within {TERCILE_TOLERANCE:.0%} of 80 % on >= {TERCILE_SHARE:.0%} of series"] = \
        sum(terciles) >= TERCILE_SHARE * n_series
    targets[f"close vs persistence >= {CLOSE_WORST} on every series"] = figures["close_skill"]["min"] >= CLOSE_WORST
    if figures["range_qlike_harx"] is not None:
        targets[f"range QLIKE, the network alone vs HAR-X on its level: median >= {HARX_TARGET:+.2f}"] = \
            figures["range_qlike_harx"]["median"] >= HARX_TARGET
    for head, got in figures["heads"].items():
        targets[f"head {head} vs its persistence: median >= {CLOSE_WORST}"] = got["median"] >= CLOSE_WORST
    figures["targets"] = targets
    return figures


def significant(done: list[dict]) -> dict[str, dict]:
    """Per test (the range's QLIKE and MAE, the network alone against the bar and against HAR-X): on how many series
    the network is significantly better (Diebold-Mariano, p < 0.05, skill > 0) or worse, of how many tested. The
    series share a few test periods: these are not independent confirmations."""
    counts = {}
    for figure, against, skill in (("range_qlike", "bar", "range_qlike_network"), ("range_mae", "bar",
                                   "range_mae_network"), ("range_qlike", "harx", "range_qlike_harx"),
                                   ("range_mae", "harx", "range_mae_harx")):
        tested = [(r[f"{figure}_p_{against}"], r[skill]) for r in done
                  if r.get(f"{figure}_p_{against}") is not None and r[skill] is not None]
        counts[f"{figure}_{against}"] = {"better": sum(p < SIGNIFICANCE and v > 0 for p, v in tested),
                                         "worse": sum(p < SIGNIFICANCE and v < 0 for p, v in tested),
                                         "n": len(tested)}
    return counts


def across_seeds(by_seed: list[dict]) -> dict[str, dict]:
    """Each headline figure's median over the series, seed by seed: their median and their spread (max - min)."""
    summary = {}
    for key in (*(f"{f}_{who}" for f in FIGURES for who in ("network", "served")),
                *(f"{f}_harx" for f in HARX_FIGURES), "close_skill"):
        medians = [figures[key]["median"] for figures in by_seed if figures.get(key)]
        if medians:
            summary[key] = {"medians": medians, "median": statistics.median(medians),
                            "spread": max(medians) - min(medians)}
    return summary


def head_figures(done: list[dict]) -> dict[str, dict]:
    """Per head, its test skill against its own persistence over the series: median, worst (and which series), how
    many are above 0 and below -0.005, and how often it was served as its persistence (mix 0) or as the network (1)."""
    figures = {}
    for head in dict.fromkeys(name for r in done for name in r["head_skill"]):
        pairs = [(r["head_skill"][head], r["head_shrink"][head], r["series"]) for r in done
                 if r["head_skill"].get(head) is not None]
        skills = [skill for skill, _, _ in pairs]
        worst = min(pairs)
        figures[head] = {"median": statistics.median(skills), "min": worst[0], "worst_series": worst[2],
                         "max": max(skills), "above_0": sum(v > 0 for v in skills),
                         "below_target": sum(v < CLOSE_WORST for v in skills), "n": len(skills),
                         "mix_0": sum(mix == 0 for _, mix, _ in pairs), "mix_1": sum(mix == 1 for _, mix, _ in pairs)}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", default="v7", choices=["v7", "v8_stable", "v8_aligned"],
                        help="the bundled config to train (default: v7)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per job (early stopping may end sooner)")
    parser.add_argument("--only", default="*", help="series glob, e.g. 'BTC*' or '*_1h' (default: every series)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="a config override, as `cryptotrain run --set` takes it (repeatable)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="train into DIR and keep it (the run directory, its config and cache), to look into the "
                             "jobs afterwards; default: a temporary directory")
    parser.add_argument("--elsewhere", action="store_true",
                        help=f"the series outside the 48 instead: {SHARED_FREQTRADE} (BTC, ETH, SOL of 2024, "
                             "freqtrade's files as they are), to check that a figure holds beyond the 48")
    parser.add_argument("--data", type=Path, help=f"a directory of SYMBOL_TIMEFRAME.csv.gz to train on instead of "
                                                  f"{SHARED_OHLCV} (e.g. data/ohlcv, the bundled candles)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="train every series this many times: with the config's train.seed, then the next seeds. "
                             "A difference smaller than the spread of the figures over seeds is noise (default 3)")
    parser.add_argument("--shipped", action="store_true",
                        help="the family at full size, as shipped (its units, batch size and early stopping), only "
                             "its epochs capped by --epochs; default: the miniature (units 128/64/32 -> 16/16/8, "
                             "batch 64, patience 2)")
    parser.add_argument("--first-seed", type=int,
                        help="the first of the seeds (default: the config's train.seed, 42 for v7)")
    parser.add_argument("--json", type=Path, help="where to write the figures (default benchmarks/results/skill.json)")
    args = parser.parse_args(argv)
    console = Console(width=140)
    corpus = args.data or (SHARED_FREQTRADE if args.elsewhere else SHARED_OHLCV)
    if not corpus.is_dir():
        console.print(f"bench-skill runs over every series in {corpus} (../shared beside the checkout, or --data); "
                      "it is not there, so nothing was measured")
        return 2
    series = series_of(args.only, corpus, args.elsewhere)
    if not series:
        console.print(f"no series matching {args.only!r} in {corpus}")
        return 2

    first_seed = args.first_seed if args.first_seed is not None else \
        yaml.safe_load((REPO / "configs" / f"{args.family}.yaml").read_text())["train"]["seed"]
    by_seed = []
    for seed in range(first_seed, first_seed + args.seeds):
        with (contextlib.nullcontext(args.keep / f"seed-{seed}") if args.keep else
              tempfile.TemporaryDirectory(prefix="bench-skill-")) as scratch:
            Path(scratch).mkdir(parents=True, exist_ok=True)
            console.print(f"[bold]{args.family}[/], seed {seed}: training {len(series)} series, {args.epochs} epochs "
                          "each")
            results, seconds = train(args.family, series, args.epochs, Path(scratch),
                                     [*args.overrides, f"train.seed={seed}"], corpus, args.elsewhere, args.shipped)
        rows = {s: row(results.get(s)) for s in series}
        for name, r in rows.items():
            if r is not None:
                r["series"] = name
        figures = overall(rows, len(series))
        print_figures(console, args, seed, series, rows, figures, seconds)
        by_seed.append({"seed": seed, "seconds": seconds, "overall": figures, "per_series": rows})
    spread = across_seeds([run["overall"] for run in by_seed])
    print_seeds(console, spread, [run["seed"] for run in by_seed])
    results_file = args.json or (RESULTS.with_stem("skill-elsewhere") if args.elsewhere else RESULTS)
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "corpus": str(corpus),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus", "family": args.family,
        "overrides": args.overrides, "epochs": args.epochs, "size": "shipped" if args.shipped else "miniature",
        "units": None if args.shipped else NARROW, "series": series,
        "seeds": [run["seed"] for run in by_seed], "seconds": sum(run["seconds"] for run in by_seed),
        # the config's own seed (its targets as checked), each seed's, and each figure's median over the seeds
        "overall": by_seed[0]["overall"], "per_series": by_seed[0]["per_series"], "by_seed": by_seed,
        "across_seeds": spread,
    }, indent=1))
    console.print(f"written: {results_file}")
    return 0


def print_seeds(console: Console, spread: dict[str, dict], seeds: list[int]) -> None:
    """Each headline figure's median over the series, per seed, and their spread."""
    table = Table(title=f"over {len(seeds)} seeds: each figure's median over the series (the network alone / what "
                        "users get, vs HAR + time of day on its level; harx: the network alone vs HAR-X on its level)")
    for column in ("figure", *(f"seed {seed}" for seed in seeds), "median", "spread"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for key, got in spread.items():
        table.add_row(key, *(f"{m:+.4f}" for m in got["medians"]), f"{got['median']:+.4f}", f"{got['spread']:.4f}")
    console.print(table)


def print_figures(console: Console, args: argparse.Namespace, seed: int, series: list[str],
                  rows: dict[str, dict | None], figures: dict, seconds: float) -> None:
    variant = f" with {' '.join(args.overrides)}" if args.overrides else ""
    size = "as shipped" if args.shipped else "the miniature"
    table = Table(title=f"{args.family}{variant}, seed {seed} ({size}, at most {args.epochs} epochs): skill on the "
                        "test split vs HAR + time of day on its validation level, the network alone / what users get",
                  caption="range: the next candle's ln(high / low), QLIKE of the root-mean-square range and MAE of "
                          "the median; high + low: MAE of the two excursions from the last close; mean range: QLIKE "
                          "of the mean range of the next steps; used: the network's weight beside HAR > 0; 80 %: the "
                          "conformal method's interval, its coverage overall and by volatility tercile; close: vs "
                          "persistence, every step")
    for column in ("series", "range QLIKE", "range MAE", "high + low", "mean range", "used", "80 %", "by tercile",
                   "close"):
        table.add_column(column, justify="left" if column == "series" else "right")
    for s in series:
        r = rows[s]
        if r is None:
            table.add_row(s, *["failed"] + [""] * 7)
            continue
        table.add_row(s, *(f"{_fmt(r[f'{f}_network'], '+.3f')} / {_fmt(r[f'{f}_served'], '+.3f')}" for f in FIGURES),
                      "yes" if r["correction_used"] else "no", _fmt(r["coverage"], ".1%"),
                      "/".join(_fmt(c, ".0%") for c in r["coverage_by_tercile"]), _fmt(r["close_skill"], "+.4f"))
    console.print(table)
    if not figures["jobs"]:
        console.print("no job finished")
        return

    def spread(got: dict) -> str:
        return f"median {got['median']:+.4f} [{got['min']:+.4f}, {got['max']:+.4f}], > 0 on {got['above_0']}/{got['n']}"

    console.print("[bold]vs HAR + time of day on its validation level (like with like):[/]")
    for f in FIGURES:
        net, served = figures[f"{f}_network"], figures[f"{f}_served"]
        if net is not None:
            console.print(f"{LABELS[f]:>16}: the network alone {spread(net)}; what users get median "
                          f"{served['median']:+.4f} [{served['min']:+.4f}, {served['max']:+.4f}]")
    console.print("[bold]as fitted[/] (the network alone vs HAR + time of day as fitted on the train split):")
    for f in FITTED_FIGURES:
        if (fitted := figures[f"{f}_fitted"]) is not None:
            console.print(f"{LABELS[f]:>16}: {spread(fitted)}")
    console.print("[bold]vs HAR-X on its level[/] (HAR + time of day with the network's extra inputs - volume "
                  "surprise, the market's range - linear, fitted on train; what the network adds beyond a linear "
                  "model of the same information):")
    for f in HARX_FIGURES:
        if (harx := figures[f"{f}_harx"]) is not None:
            console.print(f"{LABELS[f]:>16}: {spread(harx)}")
    console.print("[bold]on the validation split[/] (the network alone vs HAR on its level there; compare variants "
                  "by these):")
    for f in VALIDATION_FIGURES:
        if (validation := figures[f"{f}_validation"]) is not None:
            console.print(f"{LABELS[f]:>16}: {spread(validation)}")
    console.print(f"[bold]significant at {SIGNIFICANCE:.0%}[/] (Diebold-Mariano, the network alone; the series share "
                  "a few test periods: not independent confirmations):")
    for test, got in figures["significant"].items():
        figure, against = test.rsplit("_", 1)
        console.print(f"{LABELS[figure]:>16} vs {'HAR-X' if against == 'harx' else 'HAR + time of day'}: better on "
                      f"{got['better']}, worse on {got['worse']}, of {got['n']}")
    console.print(f"the network's correction used (weight > 0) on {figures['correction_used']}/{figures['jobs']}")
    methods = sorted({r["interval_method"] for r in rows.values() if r is not None})
    console.print(f"80 % interval, the conformal method's ({', '.join(methods)}): median coverage "
                  f"{figures['coverage']['median']:.1%} [{figures['coverage']['min']:.1%}, "
                  f"{figures['coverage']['max']:.1%}], in 77-83 % on {figures['coverage_in_range']}/{len(series)}; "
                  "by tercile (medians) " + " / ".join(f"{c:.1%}" for c in figures["median_coverage_by_tercile"])
                  + f", all three within 5 points on {figures['terciles_within_tolerance']}/{len(series)}")
    console.print(f"close vs persistence: median {figures['close_skill']['median']:+.4f}, worst "
                  f"{figures['close_skill']['min']:+.4f}; {seconds:.0f} s")
    console.print("[bold]every head vs its own persistence[/] (each column's last value; MAE over its columns and "
                  "steps; mix: the network's weight, chosen on validation):")
    for head, got in figures["heads"].items():
        console.print(f"{head:>16}: median {got['median']:+.4f}, worst {got['min']:+.4f} ({got['worst_series']}), "
                      f"best {got['max']:+.4f}; > 0 on {got['above_0']}/{got['n']}, below {CLOSE_WORST} on "
                      f"{got['below_target']}; mix 0 on {got['mix_0']}, 1 on {got['mix_1']}")
    for target, met in figures["targets"].items():
        console.print(f"  {'MET    ' if met else 'NOT MET'}  {target}")


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
