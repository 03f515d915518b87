"""The sections of a run's config that the model stage reads: the trunk (ModelConfig), what a network is built from
(NetworkSpec) and how it is trained (TrainConfig). config.RunConfig assembles them with the data stage's
(data/settings.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import ConfigError
from ..heads import Head
from ..specs import Strict, listed
from .layers import Layer


class Engine(BaseModel):
    """What trained a job (metrics.json's "engine"): Keras on TensorFlow, one job at a time, or on JAX, packed,
    `jobs` at a time (1 where TensorFlow is not installed); at what precision, on what device."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Literal["tensorflow", "jax"]
    jobs: int  # trained together in one step
    precision: str  # Keras's dtype policy, e.g. float32, mixed_bfloat16
    device: str  # e.g. "cpu", "gpu: NVIDIA H100 80GB HBM3"

    def describe(self) -> str:
        """E.g. "Keras on JAX, 40 jobs in one step, mixed_bfloat16, on gpu: NVIDIA H100 80GB HBM3" (the report's and
        the model card's)."""
        how = "alone" if self.jobs == 1 else f"{self.jobs} jobs in one step"
        return f"Keras on {'JAX' if self.name == 'jax' else 'TensorFlow'}, {how}, {self.precision}, on {self.device}"


# ----------------------------------------------------------------------------- model layers
class ModelConfig(Strict):
    """The trunk, in order. Each head becomes a linear Dense on top (per time step if the trunk
    ends in a sequence)."""
    layers: list[listed(Layer)] = Field(min_length=1)


@dataclass(frozen=True, eq=False)
class NetworkSpec:
    """What a network is built from, and nothing else of the run's config (cf. nanoGPT's GPTConfig): the trunk
    (the model section), the heads, the window's shape and the input columns (RunConfig.network)."""
    name: str  # the Keras model's
    model: ModelConfig
    heads: tuple[Head, ...]
    lookback: int
    horizon: int
    relative: bool  # framed relative to the last close (window.relative_to): the heads start at "no change"
    columns: tuple[str, ...]  # the input features, in order
    error: Callable[[str], ConfigError] = ConfigError  # a spec Keras cannot chain: names the config's file

    @property
    def n_features(self) -> int:
        return len(self.columns)


# ----------------------------------------------------------------------------- training
class EarlyStoppingConfig(Strict):
    monitor: str = "val_loss"
    patience: int = Field(20, ge=0)
    min_delta: float = Field(0.0, ge=0)
    restore_best_weights: bool = True


class ReduceLrConfig(Strict):
    monitor: str = "val_loss"
    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(8, ge=0)
    min_lr: float = Field(1e-6, ge=0)


class TrainConfig(Strict):
    optimizer: Literal["adam", "adamw", "rmsprop", "sgd"] = "adam"
    learning_rate: float = Field(1e-3, gt=0)
    clipvalue: float | None = Field(None, gt=0)
    clipnorm: float | None = Field(None, gt=0)
    batch_size: int = Field(32, gt=0)
    epochs: int = Field(100, gt=0)
    early_stopping: EarlyStoppingConfig | None = EarlyStoppingConfig()
    reduce_lr: ReduceLrConfig | None = ReduceLrConfig()
    seed: int = 42
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16", "auto"] = "float32"
    steps_per_execution: int = Field(1, gt=0)
    # Epoch-level logs per job under RUN/tensorboard/JOB (Keras's TensorBoard callback):
    # `tensorboard --logdir runs/NAME/tensorboard` compares every job of the run.
    tensorboard: bool = False
    # Jobs trained together in one compiled step on Keras's JAX backend (run --pack; run.packing): 1 trains one job
    # at a time with TensorFlow; "auto" packs on an accelerator (K from its memory) and is 1 on a CPU.
    pack: Annotated[int, Field(gt=0)] | Literal["auto"] = 1

    @model_validator(mode="after")
    def _one_kind_of_clipping(self) -> TrainConfig:
        if self.clipvalue is not None and self.clipnorm is not None:
            raise ValueError("set clipvalue or clipnorm, not both")
        return self


# How long a job may train. Changing them on an existing run extends or shortens its jobs' training instead of
# making it another run (runner.budget_plan decides, job by job).
# Inference (validation, test predictions, a warm start's pass over the train split) keeps no activations for
# gradients, so a large batch costs little memory and saves per-step dispatch: a job's validation passes take about
# half the time they take at batch 64.
INFERENCE_BATCH_SIZE = 1024
BUDGET_KEYS = ("train.epochs", "train.early_stopping.patience")
