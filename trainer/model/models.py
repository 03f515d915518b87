"""Model spec (the YAML layer list and the heads) -> compiled keras.Model: the trunk's layers build themselves
(trainer.model.layers), so do the heads (trainer.heads); the optimizer is made here."""
from __future__ import annotations

import time
from collections.abc import Sequence

import keras
import numpy as np

from ..data.windows import Preprocessing, SplitWindows, Windows
from ..heads import Head, WarmStart
from ..heads import losses as _registered  # noqa: F401 (a model.keras compiled with them loads in this process)
from .settings import INFERENCE_BATCH_SIZE, NetworkSpec, TrainConfig
from .trained import Forecasts

OPTIMIZERS: dict[str, type[keras.optimizers.Optimizer]] = {
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}


def build_model(spec: NetworkSpec, train: TrainConfig) -> keras.Model:
    """The compiled model: inputs (lookback, n_features) (with the inputs heads read beside them, a dict of them:
    "inputs" and theirs), outputs a dict keyed by output name (each head's, Head.outputs)."""
    return build_network(spec, train)[0]


def build_network(spec: NetworkSpec, train: TrainConfig) -> tuple[keras.Model, tuple[WarmStart, ...]]:
    """The compiled model (build_model), and the warm starts of its heads, each holding the layer it sets."""
    model, warm_starts = _assemble(spec)
    model.compile(optimizer=_optimizer(train), **compile_settings(spec.heads, train))
    return model, warm_starts


def compile_settings(heads: Sequence[Head], train: TrainConfig) -> dict:
    """compile()'s arguments other than the optimizer (training.WindowTrainer is compiled with them too): each
    head's losses and their weights."""
    return {
        "loss": {output: loss for head in heads for output, loss in head.losses().items()},
        "loss_weights": {output: weight for head in heads for output, weight in head.loss_weights().items()},
        "steps_per_execution": train.steps_per_execution,
        "jit_compile": False,  # XLA measured slower on CPU (trainer.model.device) and cannot run the cuDNN LSTM kernel
    }


def output_shapes(model: keras.Model, heads: Sequence[Head]) -> dict[str, tuple[int, ...]]:
    """Head name -> the shape of its targets (Head.target_shape of its output's, without the batch axis)."""
    return {head.name: head.target_shape(tuple(model.output[head.name].shape[1:])) for head in heads}


def count_params(spec: NetworkSpec) -> int:
    return _assemble(spec)[0].count_params()


def _assemble(spec: NetworkSpec) -> tuple[keras.Model, tuple[WarmStart, ...]]:
    inputs = keras.Input(shape=(spec.lookback, spec.n_features), name="inputs")
    # The inputs the heads read beside the windows (Head.input_shapes)
    beside = {name: keras.Input(shape=shape, name=name) for head in spec.heads
              for name, shape in head.input_shapes(spec.horizon).items()}
    x = inputs
    for i, layer_spec in enumerate(spec.model.layers):
        # Stable names: checkpoints load by name.
        layer = layer_spec.build(f"trunk_{i}_{layer_spec.kind}", spec.horizon)
        try:
            x = layer(x)
        except ValueError as exc:  # e.g. an LSTM after a layer that outputs no sequence
            raise spec.error(f"model.layers[{i}] ({layer_spec.kind}): {str(exc).strip().splitlines()[0]}") from None
    per_step = _ends_in_sequence(tuple(x.shape), spec)
    outputs, warm_starts = {}, []
    for head in spec.heads:
        built = head.build(x, per_step, spec.relative, {"inputs": inputs, **beside})
        outputs |= built.outputs
        warm_starts += [built.warm_start] if built.warm_start is not None else []
    model = keras.Model({"inputs": inputs, **beside} if beside else inputs, outputs, name=spec.name)
    return model, tuple(warm_starts)


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


def _optimizer(train: TrainConfig) -> keras.optimizers.Optimizer:
    return OPTIMIZERS[train.optimizer](learning_rate=train.learning_rate, clipvalue=train.clipvalue,
                                       clipnorm=train.clipnorm)


def predict_prices(model: keras.Model, split: SplitWindows, preprocessing: Preprocessing,
                   batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """Head -> predictions in price units, shaped like that head's targets in `split.y`."""
    return preprocessing.to_prices(predict_fixed_batches(model, split.x, batch_size), split.last)


def predict_fixed_batches(model: keras.Model, x: np.ndarray | dict[str, np.ndarray],
                          batch_size: int = INFERENCE_BATCH_SIZE) -> dict[str, np.ndarray]:
    """model outputs for `x` (an array, or a dict of arrays of one length: SplitWindows.x), fed in batches of one
    fixed size (the last one zero-padded).

    Each new input length would otherwise trace the predict function again (about 0.1 s a job on CPU);
    with one batch shape, one trace serves every job of the same model.
    """
    arrays = x if isinstance(x, dict) else {None: x}
    n = len(next(iter(arrays.values())))
    padded = {k: np.concatenate([v, np.zeros(((-n) % batch_size, *v.shape[1:]), dtype=v.dtype)])
              for k, v in arrays.items()}

    def batch(i: int):
        part = {k: v[i:i + batch_size] for k, v in padded.items()}
        return part if isinstance(x, dict) else part[None]

    batches = [model.predict_on_batch(batch(i)) for i in range(0, n + (-n) % batch_size, batch_size)]
    return {name: np.concatenate([b[name] for b in batches])[:n] for name in batches[0]}


def forecasts(model: keras.Model, windows: Windows) -> Forecasts:
    """A job's model outputs on its validation and test windows (a job trained alone: its evaluation scores them)."""
    started = time.perf_counter()
    val = predict_fixed_batches(model, windows.val.x)
    test = predict_fixed_batches(model, windows.test.x)
    return Forecasts(val, test, time.perf_counter() - started)
