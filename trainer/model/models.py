"""Model spec (the YAML layer list) -> compiled keras.Model: the trunk's layers build themselves
(trainer.model.layers), the heads, the losses and the optimizer are made here."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import keras

from ..data.settings import HAR_INPUTS, HeadConfig, range_output
from .settings import NetworkSpec, TrainConfig

F32 = {"dtype": "float32"}  # the heads stay float32 under mixed precision
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


# The losses of our own are registered, so that a process that imported cryptotrain loads a model.keras compiled;
# anyone else loads it with compile=False (inference needs no loss; the model card says so).
@keras.saving.register_keras_serializable(package="cryptotrain")
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


@keras.saving.register_keras_serializable(package="cryptotrain")
class Qlike(keras.losses.Loss):
    """QLIKE of a range forecast f against the actual range r (Patton 2011): r^2 / f^2 - ln(r^2 / f^2) - 1, with r^2
    floored at `floor`^2 in the logarithm (a flat candle); minimised by f^2 = E[r^2]: the root-mean-square range.
    Scale-free, so the scaled units of a HAR head's range output do not change it."""

    def __init__(self, floor: float = 1e-4, name: str = "qlike", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.floor = floor

    def call(self, y_true, y_pred):
        actual = keras.ops.square(keras.ops.cast(y_true, y_pred.dtype))
        forecast = keras.ops.square(y_pred)
        ratio = actual / forecast
        floored = keras.ops.maximum(actual, self.floor**2) / forecast
        return keras.ops.mean(ratio - keras.ops.log(floored) - 1.0, axis=-1)

    def get_config(self) -> dict:
        return {**super().get_config(), "floor": self.floor}


def compile_settings(heads: Sequence[HeadConfig], train: TrainConfig) -> dict:
    """compile()'s arguments other than the optimizer (training.WindowTrainer is compiled with them too). A HAR
    head's range output is trained on QLIKE, with the head's weight."""
    return {
        "loss": {head.name: Pinball(head.quantiles) if head.quantiles else head.loss for head in heads}
        | {range_output(head.name): Qlike() for head in heads if head.har},
        "loss_weights": {head.name: head.weight for head in heads}
        | {range_output(head.name): head.weight for head in heads if head.har},
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
    # A HAR head's inputs: HAR + time of day's forecast of each step (Preprocessing.har_inputs)
    har = {name: keras.Input(shape=(spec.horizon, 1), name=name) for name in HAR_INPUTS} \
        if any(head.har for head in spec.heads) else {}
    x = inputs
    for i, layer_spec in enumerate(spec.model.layers):
        # Stable names: checkpoints load by name.
        layer = layer_spec.build(f"trunk_{i}_{layer_spec.kind}", spec.horizon)
        try:
            x = layer(x)
        except ValueError as exc:  # e.g. an LSTM after a layer that outputs no sequence
            raise spec.error(f"model.layers[{i}] ({layer_spec.kind}): {str(exc).strip().splitlines()[0]}") from None
    per_step = _ends_in_sequence(tuple(x.shape), spec)
    outputs = {}
    for head in spec.heads:
        outputs |= _har_candle(head, x, per_step, har, inputs) if head.har else \
            {head.name: _head(head, x, per_step, spec.relative)}
    return keras.Model({"inputs": inputs, **har} if har else inputs, outputs, name=spec.name)


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
    dense = _dense(trunk, per_step, "zeros" if relative else "glorot_uniform")
    if head.quantiles:  # the lowest quantile, then non-negative gaps: ordered (..., Q, C)
        columns, shape = len(head.columns), (trunk.shape[1],) if per_step else ()
        quantile = dense(columns, f"{head.name}_q0")
        stacked = [quantile]
        for i in range(1, len(head.quantiles)):
            gap = dense(columns, f"{head.name}_gap{i}", "softplus")
            quantile = keras.layers.Add(**F32)([quantile, gap])
            stacked.append(quantile)
        stacked = [keras.layers.Reshape((*shape, 1, columns), **F32)(q) for q in stacked]
        return keras.layers.Concatenate(axis=-2, name=head.name, **F32)(stacked)
    if not head.candle:
        return dense(len(head.columns), head.name)
    open_, close = dense(1, f"{head.name}_open"), dense(1, f"{head.name}_close")
    upper, lower = dense(1, f"{head.name}_upper_wick", "softplus"), dense(1, f"{head.name}_lower_wick", "softplus")
    parts = {
        "open": open_, "close": close,
        "high": keras.layers.Add(**F32)([keras.layers.Maximum(**F32)([open_, close]), upper]),
        "low": keras.layers.Subtract(**F32)([keras.layers.Minimum(**F32)([open_, close]), lower]),
    }
    return keras.layers.Concatenate(name=head.name, **F32)([parts[column] for column in head.columns])


def _dense(trunk: keras.KerasTensor, per_step: bool, init: str) -> Callable[..., keras.KerasTensor]:
    """A head's Dense of `units` on the trunk (per time step when it ends in a sequence), float32."""

    def dense(units: int, name: str, activation: str | None = None) -> keras.KerasTensor:
        layer = keras.layers.Dense(units, activation=activation, kernel_initializer=init, dtype="float32",
                                   name=name)
        return (keras.layers.TimeDistributed(layer, dtype="float32", name=name) if per_step else layer)(trunk)

    return dense


def _har_candle(head: HeadConfig, trunk: keras.KerasTensor, per_step: bool, har: dict[str, keras.KerasTensor],
                inputs: keras.KerasTensor) -> dict[str, keras.KerasTensor]:
    """A candle head started at HAR + time of day (HeadConfig.har; HARNet): the high excursion, the low one and
    the root-mean-square log range are HAR's forecast of each (the HAR_INPUTS, scaled as the head's columns) times
    exp(c), one correction of the coming volatility per step: tanh of a Dense of the trunk plus a Dense of the
    window's last input row less the window's mean (what HAR's regression could add linearly: a volume or market
    surprise, its own terms reweighed; less the mean, so that a level the train split never saw - a regime of high
    volatility, which HAR's own terms already carry - is not extrapolated), both zero as built; training starts the
    linear one at its least-squares fit on the train split (training.start_linear_term). tanh bounds the
    correction to a factor of e^-1 .. e^1. An untrained head forecasts exactly HAR's high, low and range, and a
    body of open = close = the last close ("no change").
    high = max(open, close, HAR's high x exp(c)), low = min(open, close, -HAR's low x exp(c)): a candle.
    -> the head's candle, and its range (range_output), each per step."""
    dense = _dense(trunk, per_step, "zeros")
    open_, close = dense(1, f"{head.name}_open"), dense(1, f"{head.name}_close")
    steps = trunk.shape[1] if per_step else 1
    last_row = keras.layers.Flatten(**F32)(keras.layers.Cropping1D((inputs.shape[1] - 1, 0), **F32)(inputs))
    surprise = keras.layers.Subtract(**F32)([last_row, keras.layers.GlobalAveragePooling1D(**F32)(inputs)])
    if not per_step:  # horizon 1 on a trunk that ends in one vector: (batch, 1, 1) -> (batch, 1)
        har = {name: keras.layers.Reshape((1,), **F32)(tensor) for name, tensor in har.items()}

    linear = keras.layers.Dense(steps, kernel_initializer="zeros", name=f"{head.name}_correction_linear",
                                **F32)(surprise)
    if per_step:
        linear = keras.layers.Reshape((steps, 1), **F32)(linear)
    correction = keras.layers.Activation("tanh", **F32)(keras.layers.Add(**F32)([dense(1, f"{head.name}_correction"),
                                                                                 linear]))
    scale = keras.layers.Activation("exponential", **F32)(correction)
    parts = {
        "open": open_, "close": close,
        "high": keras.layers.Maximum(**F32)([open_, close, keras.layers.Multiply(**F32)([har["har_high"], scale])]),
        "low": keras.layers.Minimum(**F32)([open_, close, keras.layers.Multiply(**F32)([har["har_low"], scale])]),
    }
    candle = keras.layers.Concatenate(name=head.name, **F32)([parts[column] for column in head.columns])
    range_ = keras.layers.Multiply(name=range_output(head.name), **F32)([har["har_range"], scale])
    return {head.name: candle, range_output(head.name): range_}


def _optimizer(train: TrainConfig) -> keras.optimizers.Optimizer:
    return OPTIMIZERS[train.optimizer](learning_rate=train.learning_rate, clipvalue=train.clipvalue,
                                       clipnorm=train.clipnorm)
