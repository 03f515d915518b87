"""Model spec (the YAML layer list) -> compiled keras.Model: the trunk's layers build themselves
(trainer.model.layers), the heads, the losses and the optimizer are made here."""
from __future__ import annotations

from collections.abc import Sequence

import keras

from ..data.settings import HeadConfig
from .settings import NetworkSpec, TrainConfig

OPTIMIZERS: dict[str, type[keras.optimizers.Optimizer]] = {
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}


def build_model(spec: NetworkSpec, train: TrainConfig) -> keras.Model:
    """The compiled model: inputs (lookback, n_features), outputs a dict keyed by head name."""
    model = _assemble(spec)
    model.compile(optimizer=_optimizer(train), **compile_settings(spec.heads, train))
    return model


class Pinball(keras.losses.Loss):
    """The pinball (quantile) loss of a quantile head, averaged over its levels: outputs (..., Q, C) against
    targets (..., C)."""

    def __init__(self, levels: list[float], name: str = "pinball", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.levels = list(levels)

    def call(self, y_true, y_pred):
        levels = keras.ops.reshape(keras.ops.convert_to_tensor(self.levels, dtype=y_pred.dtype), (-1, 1))
        error = keras.ops.expand_dims(keras.ops.cast(y_true, y_pred.dtype), -2) - y_pred  # (..., Q, C)
        return keras.ops.mean(keras.ops.maximum(levels * error, (levels - 1) * error), axis=(-2, -1))

    def get_config(self) -> dict:
        return {**super().get_config(), "levels": self.levels}


def compile_settings(heads: Sequence[HeadConfig], train: TrainConfig) -> dict:
    """compile()'s arguments other than the optimizer (training.WindowTrainer is compiled with them too)."""
    return {
        "loss": {head.name: Pinball(head.quantiles) if head.quantiles else head.loss for head in heads},
        "loss_weights": {head.name: head.weight for head in heads},
        "steps_per_execution": train.steps_per_execution,
        "jit_compile": False,  # XLA measured slower on CPU (trainer.model.device) and cannot run the cuDNN LSTM kernel
    }


def output_shapes(model: keras.Model, heads: Sequence[HeadConfig] = ()) -> dict[str, tuple[int, ...]]:
    """Head name -> the shape of its targets: its output's without the batch axis, and without the quantile axis
    (the last but one) of the quantile heads among `heads`."""
    quantile_heads = {head.name for head in heads if head.quantiles}
    return {name: tuple(tensor.shape[1:-2]) + tuple(tensor.shape[-1:]) if name in quantile_heads
            else tuple(tensor.shape[1:]) for name, tensor in model.output.items()}


def count_params(spec: NetworkSpec) -> int:
    return _assemble(spec).count_params()


def _assemble(spec: NetworkSpec) -> keras.Model:
    inputs = keras.Input(shape=(spec.lookback, spec.n_features), name="inputs")
    x = inputs
    for i, layer_spec in enumerate(spec.model.layers):
        # Stable names: checkpoints load by name.
        layer = layer_spec.build(f"trunk_{i}_{layer_spec.kind}", spec.horizon)
        try:
            x = layer(x)
        except ValueError as exc:  # e.g. an LSTM after a layer that outputs no sequence
            raise spec.error(f"model.layers[{i}] ({layer_spec.kind}): {str(exc).strip().splitlines()[0]}") from None
    per_step = _ends_in_sequence(tuple(x.shape), spec)
    outputs = {head.name: _head(head, x, per_step, spec.relative) for head in spec.heads}
    return keras.Model(inputs, outputs, name=spec.name)


def _ends_in_sequence(trunk_shape: tuple, spec: NetworkSpec) -> bool:
    """Whether the heads apply per time step; the trunk must end in `horizon` steps or, for horizon 1,
    may end in one vector."""
    horizon = spec.horizon
    if len(trunk_shape) == 2:
        if horizon > 1:
            raise spec.error(
                f"model.layers: the last layer outputs one vector, but window.horizon is {horizon}; end the "
                f"layers in a sequence of {horizon} steps (e.g. repeat_vector, then lstm with return_sequences)"
            )
        return False
    if trunk_shape[1] != horizon:
        raise spec.error(
            f"model.layers: the last layer outputs a sequence of {trunk_shape[1]} steps, but window.horizon "
            f"is {horizon}; end the layers in a sequence of {horizon} steps (e.g. repeat_vector first)"
        )
    return True


def _head(head: HeadConfig, trunk: keras.KerasTensor, per_step: bool, relative: bool) -> keras.KerasTensor:
    """A head's output: linear Dense units, one per column (per time step if the trunk ends in a sequence),
    float32 so that it stays float32 under mixed precision.

    Framed relative to the last close, a head starts at zero, i.e. at "no change" (its targets are scaled
    with offset 0, see windows.py): the network learns deviations from the last close, as in NLinear.
    A quantile head outputs (..., Q, C): its lowest quantile, then each next one as the one below plus a gap
    through softplus, so they never cross.
    A candle head outputs open and close, and two wicks through softplus (never negative):
    high = max(open, close) + upper wick, low = min(open, close) - lower wick; the target scaler shares one
    scale between the four, so the candle is consistent in prices too."""
    init = "zeros" if relative else "glorot_uniform"

    def dense(units: int, name: str, activation: str | None = None) -> keras.KerasTensor:
        layer = keras.layers.Dense(units, activation=activation, kernel_initializer=init, dtype="float32",
                                   name=name)
        return (keras.layers.TimeDistributed(layer, dtype="float32", name=name) if per_step else layer)(trunk)

    f32 = {"dtype": "float32"}
    if head.quantiles:  # the lowest quantile, then non-negative gaps: ordered (..., Q, C)
        columns, shape = len(head.columns), (trunk.shape[1],) if per_step else ()
        quantile = dense(columns, f"{head.name}_q0")
        stacked = [quantile]
        for i in range(1, len(head.quantiles)):
            gap = dense(columns, f"{head.name}_gap{i}", "softplus")
            quantile = keras.layers.Add(**f32)([quantile, gap])
            stacked.append(quantile)
        stacked = [keras.layers.Reshape((*shape, 1, columns), **f32)(q) for q in stacked]
        return keras.layers.Concatenate(axis=-2, name=head.name, **f32)(stacked)
    if not head.candle:
        return dense(len(head.columns), head.name)
    open_, close = dense(1, f"{head.name}_open"), dense(1, f"{head.name}_close")
    upper, lower = dense(1, f"{head.name}_upper_wick", "softplus"), dense(1, f"{head.name}_lower_wick", "softplus")
    parts = {
        "open": open_, "close": close,
        "high": keras.layers.Add(**f32)([keras.layers.Maximum(**f32)([open_, close]), upper]),
        "low": keras.layers.Subtract(**f32)([keras.layers.Minimum(**f32)([open_, close]), lower]),
    }
    return keras.layers.Concatenate(name=head.name, **f32)([parts[column] for column in head.columns])


def _optimizer(train: TrainConfig) -> keras.optimizers.Optimizer:
    return OPTIMIZERS[train.optimizer](learning_rate=train.learning_rate, clipvalue=train.clipvalue,
                                       clipnorm=train.clipnorm)
