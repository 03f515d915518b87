"""`cryptotrain` command line: thin click commands over the library; parsing and printing only.

Heavy modules (TensorFlow) are imported inside the commands, so `--help` answers at once.
"""
from __future__ import annotations

import logging
import os
import shlex
import sys
import traceback
from pathlib import Path

import click

# TensorFlow's C++ start-up chatter (oneDNN notices, CPU feature lists) buries our output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from . import __version__
from .errors import Interrupted, JobError, RunStopped, UserError
from .run.engine import TENSORFLOW_INSTALL, engine_for, import_tensorflow, keras_for_a_model, keras_on_jax


class _Cli(click.Group):
    """Turns the library's UserError / JobError into one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (UserError, JobError, RunStopped) as exc:
            if ctx.meta.get("debug"):
                traceback.print_exc()
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


class _Stderr(logging.Handler):
    """One line per record on sys.stderr as it is at that moment: the progress display's proxy while it runs (the
    line lands above the display), click's stream under its CliRunner."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


_LOG_LINES = _Stderr(logging.INFO)


class _CountOrAuto(click.ParamType):
    name = "count"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value, param, ctx):
        if value == "auto" or (isinstance(value, str) and value.isdigit() and int(value) > 0):
            return value
        self.fail(f"{value!r} is neither a number of {self.what} (1, 2, ...) nor auto", param, ctx)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="cryptotrain")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Train, evaluate and publish crypto price forecasters, one model per symbol x timeframe.

    \b
    Quick start (offline, real candles bundled in data/ohlcv, under a minute on CPU):
      cryptotrain run --config quickstart
    The real families (40 jobs each), resumable at any moment:
      cryptotrain plan --config v8_aligned
      cryptotrain run  --config v8_aligned --only 'BTC*' --timeframes 15m
      cryptotrain status runs/v8_aligned
    """
    ctx.meta["debug"] = debug
    # The library's notes and warnings, from the package's logger ("trainer") and each module's child of it. Adding
    # the same handler again (main invoked again in one process) changes nothing.
    library = logging.getLogger(__package__)
    library.setLevel(logging.INFO)
    library.addHandler(_LOG_LINES)


def config_options(func):
    """--config, --set, --only, --timeframes: shared by every command that reads a run config."""
    func = click.option("--timeframes", "timeframes", default="", metavar="TF[,TF]",
                        help="Only these timeframes, e.g. --timeframes 15m.")(func)
    func = click.option("--only", "only", multiple=True, metavar="PATTERN",
                        help="Only symbols or jobs matching this shell pattern, e.g. --only 'BTC*' "
                             "or --only ETHUSDT_1h. Repeatable.")(func)
    func = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                        help="Override a config value without editing the file, e.g. --set train.epochs=2. "
                             "Repeatable; VALUE is YAML.")(func)
    func = click.option("--config", "-c", "config_path", required=True, metavar="FILE",
                        help="Run config (YAML). A bundled name also works: quickstart, v7, v8_stable, "
                             "v8_aligned.")(func)
    return func


def _load(config_path: str, overrides: tuple[str, ...], only: tuple[str, ...], timeframes: str):
    from .config import load_config
    from .run.jobs import make_jobs

    cfg = load_config(config_path, overrides)
    jobs = make_jobs(cfg, only, tuple(t for t in timeframes.split(",") if t))
    return cfg, jobs


@main.command()
@config_options
def plan(config_path, overrides, only, timeframes):
    """Print the job matrix without training: jobs, model size, windows, heads, cuDNN eligibility.

    \b
    Example:
      cryptotrain plan --config v8_stable
    """
    cfg, jobs = _load(config_path, overrides, only, timeframes)
    keras_for_a_model()
    from .report.console import print_plan
    from .run.planning import make_plan

    print_plan(make_plan(cfg, jobs))


@main.command()
@config_options
@click.option("--new-run", is_flag=True, help="Start over in a fresh run directory when the config changed "
                                              "(the old one is kept, renamed with a timestamp).")
@click.option("--retries", default=1, show_default=True, type=click.IntRange(0),
              help="Retry each failed job this many times (in this and later invocations). A failed job whose "
                   "candle file changed since is retried anyway.")
@click.option("--retry-failed", is_flag=True, help="Try every failed job again, however often it failed.")
@click.option("--push", is_flag=True, help="Push jobs to the Hugging Face Hub (config hub.repo_id) as they "
                                           "finish: at most one commit a minute, the rest at the end.")
@click.option("--verbose", "-v", is_flag=True, help="A line per epoch (losses), not only per job.")
@click.option("--tensorboard", is_flag=True, help="Write each job's epoch logs for TensorBoard under "
                                                  "RUN/tensorboard (as --set train.tensorboard=true).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where jobs train: this process (local, the default), or Ray workers this process drives "
                   "(pip install 'cryptotrain[ray]'). Default: the config's executor.kind.")
@click.option("--ray-address", default=None, metavar="auto|HOST:PORT",
              help="The Ray cluster to use: auto (the one `ray start` made here), or its address. Default: a "
                   "Ray started for this run on this machine only.")
@click.option("--workers", type=click.IntRange(1), default=None, help="Ray workers, each training one job at "
                                                                     "a time with its own TensorFlow (with --pack, K "
                                                                     "jobs packed on JAX) [default: 2].")
@click.option("--cpus-per-worker", type=click.FloatRange(0, min_open=True), default=None,
              help="CPUs each Ray worker takes (and its TensorFlow thread pools) [default: 1].")
@click.option("--gpus-per-worker", type=click.FloatRange(0), default=None,
              help="GPUs each Ray worker takes, e.g. 1 for one worker per GPU [default: 0].")
@click.option("--stale-after", type=click.FloatRange(1), default=None, metavar="SECONDS",
              help="Several processes on one run directory: a job whose process sent no heartbeat for this long (a "
                   "laptop asleep, a paused process) is taken over by another; the first, woken, discards its own "
                   "files of it [default: 300].")
@click.option("--pack", type=_CountOrAuto("jobs"), default=None, metavar="K|auto",
              help="Train K jobs at a time in one compiled step on Keras's JAX backend, each exactly as if alone "
                   "(pip install 'cryptotrain[jax]'): for GPUs, which one small model leaves mostly idle. auto: K "
                   "from the accelerator's memory, 1 on a CPU. With --executor ray, each worker packs K jobs. "
                   "Default: the config's train.pack (1: one job at a time, TensorFlow).")
@click.option("--host-workers", type=_CountOrAuto("processes"), default="auto", show_default=True, metavar="N|auto",
              help="Processes that prepare and evaluate jobs beside the device while it trains. auto: one per CPU "
                   "(as memory allows) when jobs train together (--pack, Ray), else 1: one job at a time, inline.")
def run(config_path, overrides, only, timeframes, new_run, retries, retry_failed, push, verbose, tensorboard,
        executor, ray_address, workers, cpus_per_worker, gpus_per_worker, stale_after, pack, host_workers):
    """Train and evaluate every job of a config, in one process; resumable.

    Interrupt it at any moment (Ctrl-C, SIGTERM, kill -9) and run the same command again: finished
    jobs are kept, an interrupted job resumes from its last finished epoch.

    On a terminal it shows progress bars; piped (| tee run.log) it prints one plain line per job
    (and per epoch with -v).

    \b
    Examples:
      cryptotrain run --config quickstart
      cryptotrain run --config v8_aligned --only 'BTC*' --set train.epochs=5
      cryptotrain run --config v8_aligned --executor ray --workers 4 --gpus-per-worker 1
      cryptotrain run --config v7 --pack 40 --executor ray --workers 2 --gpus-per-worker 1
    """
    cfg, jobs = _load(config_path, (*overrides, *(["train.tensorboard=true"] if tensorboard else []),
                                    *([f"train.pack={pack}"] if pack is not None else [])), only, timeframes)
    given = {"kind": executor, "address": ray_address, "workers": workers, "cpus_per_worker": cpus_per_worker,
             "gpus_per_worker": gpus_per_worker}
    on = cfg.executor.model_copy(update={key: value for key, value in given.items() if value is not None})
    from .run.process import set_up_run

    engine = set_up_run(cfg, on, click.get_current_context().find_root().call_on_close,
                        lambda line: click.echo(line, err=True))
    from .report.console import JobProgress, print_resume_hint, print_run_end
    from .report.html import report_at_end
    from .run.runner import run_config

    publish = None
    if push:  # the Hub's client, imported for a run that pushes
        from .publish.hub import push_pending as publish
    try:
        outcome = run_config(cfg, jobs, JobProgress(verbose=verbose), new_run=new_run, retries=retries, push=publish,
                             retry_failed=retry_failed, executor=on, host_workers=host_workers, engine=engine,
                             **({} if stale_after is None else {"stale_after": stale_after}))
    except Interrupted as stop:
        print_resume_hint(shlex.join(["cryptotrain", *sys.argv[1:]]), stop.jobs)
        sys.exit(stop.exit_code)
    print_run_end(outcome, report_at_end(outcome.run_dir))
    sys.exit(0 if outcome.complete else 1)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output, errors whole.")
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="Only symbols or jobs matching this shell pattern, e.g. --only 'BTC*'. Repeatable.")
@click.option("--timeframes", default="", metavar="TF[,TF]", help="Only these timeframes, e.g. 15m or 15m,1h.")
@click.option("--all", "show_all", is_flag=True, help="Also list the config's jobs that no run has selected yet "
                                                      "(--only, --timeframes); otherwise only counted.")
def status(run_dir, as_json, only, timeframes, show_all):
    """Show the jobs of a run: done, running, failed or pending, with metrics and pushes; one line each.

    \b
    Examples:
      cryptotrain status runs/v8_aligned
      cryptotrain status runs/v8_aligned --only 'BTC*' --timeframes 1h --json
    """
    from .report.console import print_status
    from .run.rundir import RunDir

    with RunDir.open(run_dir) as run:
        print_status(run, as_json=as_json, only=only, timeframes=tuple(t for t in timeframes.split(",") if t),
                     show_all=show_all)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--output", "-o", "out", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Where to write the page. Default: RUN_DIR/report.html.")
def report(run_dir, out):
    """Write a self-contained HTML report of a run: skill heatmap, sortable job table, per-job charts.

    Needs no TensorFlow and no network; the page opens from disk, offline. A run writes it at its end too.

    \b
    Examples:
      cryptotrain report runs/v8_aligned
      cryptotrain report runs/v8_aligned -o /tmp/v8.html
    """
    from .report.html import write_report
    from .run.rundir import RunDir

    with RunDir.open(run_dir) as run:
        click.echo(write_report(run, out))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--repo-id", default=None, metavar="NS/NAME",
              help="Target repo; may hold {symbol}/{timeframe} for one repo per job. Default: hub.repo_id "
                   "of the run's config.")
@click.option("--public/--private", "public", default=None,
              help="Visibility of a repo this push creates. Default: hub.private of the run's config (private).")
@click.option("--overwrite-cards", is_flag=True, help="Replace model cards that were edited on the Hub.")
@click.option("--only", "only", multiple=True, metavar="PATTERN", help="Only jobs matching this pattern.")
def push(run_dir, repo_id, public, overwrite_cards, only):
    """Publish a run's finished jobs to the Hugging Face Hub, in as few commits as possible.

    The token comes from HF_TOKEN or `hf auth login`. Idempotent: unchanged files are not
    uploaded again, and an interrupted push is simply run again.

    \b
    Example:
      cryptotrain push runs/v8_aligned --repo-id you/cpb-v8-aligned
    """
    from .publish.hub import push_run
    from .run.rundir import RunDir

    with RunDir.open(run_dir, config_required=True) as run:
        pushed = push_run(run, repo_id=repo_id, private=None if public is None else not public,
                          overwrite_cards=overwrite_cards, only=only)
    for name, where in pushed.items():
        click.echo(f"{name}: {where['url']}")


@main.command()
@click.option("--model", "model_ref", required=True, metavar="PATH_OR_URI",
              help="A job directory (runs/v7/jobs/BTCUSDT_15m), a run directory with --symbol/--timeframe, "
                   "or hf://NS/NAME/SYMBOL/TIMEFRAME.")
@click.option("--symbol", default=None, help="Symbol, when --model is a run directory or repo.")
@click.option("--timeframe", default=None, help="Timeframe, when --model is a run directory or repo.")
@click.option("--data", "data_path", default=None, type=click.Path(path_type=Path),
              help="Candles file (CSV/CSV.gz/Parquet) to predict from; default: the job's own data source.")
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="Config whose data source to read the latest candles from.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def predict(model_ref, symbol, timeframe, data_path, config_path, as_json):
    """Forecast the next `horizon` candles, in price units, from a trained job.

    \b
    Examples:
      cryptotrain predict --model runs/quickstart/jobs/BTCUSDT_15m
      cryptotrain predict --model hf://you/cpb-v8-aligned/BTCUSDT/15m --data btc_15m.csv --json
    """
    keras_for_a_model()
    from .publish.predict import predict_job
    from .report.console import print_prediction

    prediction = predict_job(model_ref, symbol=symbol, timeframe=timeframe, data_path=data_path,
                             config_path=config_path)
    print_prediction(prediction, as_json=as_json)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json):
    """Check that training really uses the hardware: devices, cuDNN, memory, precision, packing.

    Runs a timed small LSTM training step on each device (TensorFlow's, and Keras's JAX backend's, which
    packed runs use), says what `run --pack auto` would choose, and ends with a verdict and the fix for each
    problem found. Without a GPU it says so and still checks the CPU path; without TensorFlow, the JAX path.

    \b
    Example:
      cryptotrain doctor
    """
    if engine_for(1) == "jax":  # TensorFlow is not installed: every command runs on Keras's JAX backend
        keras_on_jax()
        from .model.machine import diagnose_on_jax
        from .run.probe import packing_on_jax

        diagnosis = diagnose_on_jax(packing_on_jax(), TENSORFLOW_INSTALL)  # asked here: this process is on JAX
    else:
        import_tensorflow()
        from .model.device import diagnose
        from .run.probe import pack_report

        diagnosis = diagnose(pack_report())  # asked of a process on JAX
    from .report.console import print_doctor

    print_doctor(diagnosis, as_json=as_json)
    sys.exit(1 if diagnosis.problems else 0)  # no GPU is a notice, not a problem


@main.command()
@config_options
def features(config_path, overrides, only, timeframes):
    """Precompute (and cache) every job's features; prints cache hits and misses.

    \b
    Example:
      cryptotrain features --config v8_stable --only 'ETH*'
    """
    cfg, jobs = _load(config_path, overrides, only, timeframes)
    from .data.features import precompute
    from .report.console import JobLines, feature_line, features_summary

    with JobLines("Computing features", len(jobs)) as lines:
        outcomes = precompute(cfg, jobs, on_job=lambda outcome: lines.add(feature_line(outcome), outcome.failed))
    lines.summary(features_summary(outcomes))
    sys.exit(1 if any(outcome.failed for outcome in outcomes) else 0)


@main.group()
def data():
    """Fetch candle data into the local cache, so that runs need no network.

    \b
    Example:
      cryptotrain data download --config my_binance.yaml
    """


@data.command()
@config_options
def download(config_path, overrides, only, timeframes):
    """Download a config's candles into the local cache (binance and hf sources).

    A second run needs no network; for binance, running it again appends the candles closed since.

    \b
    Example:
      cryptotrain data download --config my_binance.yaml --only 'BTC*'
    """
    cfg, jobs = _load(config_path, overrides, only, timeframes)
    from .data import download as download_all
    from .report.console import JobLines, download_line, download_summary

    if not cfg.data.chosen.downloads:
        click.echo(f"data.source is {cfg.data.source}: nothing to download")
        return
    with JobLines("Downloading", len(jobs)) as lines:
        outcomes = download_all(cfg, jobs, on_job=lambda outcome: lines.add(download_line(outcome), outcome.failed))
    lines.summary(download_summary(outcomes))
    sys.exit(1 if any(outcome.failed for outcome in outcomes) else 0)
