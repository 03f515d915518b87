"""Model spec (the YAML layer list) -> compiled keras.Model, through one registry of layer kinds.

Config layer specs use Keras's own argument names, so each kind maps its spec straight onto its
Keras class. Recurrent layers keep Keras's defaults (tanh / sigmoid, no recurrent dropout, bias, no
unroll, use_cudnn="auto"), so they run on cuDNN on a GPU unless the config sets otherwise.
"""
from __future__ import annotations

from collections.abc import Callable

import keras

from .config import HeadConfig, RunConfig, TrainConfig
from .config import Layer as LayerSpec

LayerBuilder = Callable[[LayerSpec, RunConfig, str], keras.layers.Layer]  # (spec, cfg, layer name)


def _keras_args(spec: LayerSpec, *drop: str) -> dict:
    return spec.model_dump(exclude={"kind", *drop})


def _plain(layer_class: type[keras.layers.Layer]) -> LayerBuilder:
    return lambda spec, cfg, name: layer_class(**_keras_args(spec), name=name)


def _bidirectional(layer_class: type[keras.layers.Layer]) -> LayerBuilder:
    return lambda spec, cfg, name: keras.layers.Bidirectional(
        layer_class(**_keras_args(spec, "merge_mode"), name=name), merge_mode=spec.merge_mode, name=name)


def _time_dense(spec: LayerSpec, cfg: RunConfig, name: str) -> keras.layers.Layer:
    return keras.layers.TimeDistributed(keras.layers.Dense(**_keras_args(spec), name=name), name=name)


def _repeat_vector(spec: LayerSpec, cfg: RunConfig, name: str) -> keras.layers.Layer:
    return keras.layers.RepeatVector(spec.n or cfg.window.horizon, name=name)


# The one registry of layer kinds, keyed by the config's `kind`.
LAYERS: dict[str, LayerBuilder] = {
    "lstm": _plain(keras.layers.LSTM),
    "gru": _plain(keras.layers.GRU),
    "bilstm": _bidirectional(keras.layers.LSTM),
    "bigru": _bidirectional(keras.layers.GRU),
    "dense": _plain(keras.layers.Dense),
    "time_dense": _time_dense,
    "dropout": _plain(keras.layers.Dropout),
    "layernorm": _plain(keras.layers.LayerNormalization),
    "repeat_vector": _repeat_vector,
}

OPTIMIZERS: dict[str, type[keras.optimizers.Optimizer]] = {
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}


def build_model(cfg: RunConfig, n_features: int) -> keras.Model:
    """The compiled model: inputs (lookback, n_features), outputs a dict keyed by head name."""
    model = _assemble(cfg, n_features)
    model.compile(
        optimizer=_optimizer(cfg.train),
        loss={head.name: head.loss for head in cfg.heads},
        loss_weights={head.name: head.weight for head in cfg.heads},
        steps_per_execution=cfg.train.steps_per_execution,
        jit_compile=False,  # XLA measured slower on CPU (trainer.device) and cannot run the cuDNN LSTM kernel
    )
    return model


def output_shapes(model: keras.Model) -> dict[str, tuple[int, ...]]:
    """Head name -> output shape without the batch axis."""
    return {name: tuple(tensor.shape[1:]) for name, tensor in model.output.items()}


def count_params(cfg: RunConfig, n_features: int) -> int:
    return _assemble(cfg, n_features).count_params()


def _assemble(cfg: RunConfig, n_features: int) -> keras.Model:
    inputs = keras.Input(shape=(cfg.window.lookback, n_features), name="inputs")
    x = inputs
    for i, spec in enumerate(cfg.model.layers):
        layer = LAYERS[spec.kind](spec, cfg, f"trunk_{i}_{spec.kind}")  # stable names: checkpoints load by name
        try:
            x = layer(x)
        except ValueError as exc:  # e.g. an LSTM after a layer that outputs no sequence
            raise cfg.error(f"model.layers[{i}] ({spec.kind}): {str(exc).strip().splitlines()[0]}") from None
    per_step = _ends_in_sequence(tuple(x.shape), cfg)
    outputs = {head.name: _head(head, per_step)(x) for head in cfg.heads}
    return keras.Model(inputs, outputs, name=cfg.name)


def _ends_in_sequence(trunk_shape: tuple, cfg: RunConfig) -> bool:
    """Whether the heads apply per time step; the trunk must end in `horizon` steps or, for horizon 1,
    may end in one vector."""
    horizon = cfg.window.horizon
    if len(trunk_shape) == 2:
        if horizon > 1:
            raise cfg.error(
                f"model.layers: the last layer outputs one vector, but window.horizon is {horizon}; end the "
                f"layers in a sequence of {horizon} steps (e.g. repeat_vector, then lstm with return_sequences)"
            )
        return False
    if trunk_shape[1] != horizon:
        raise cfg.error(
            f"model.layers: the last layer outputs a sequence of {trunk_shape[1]} steps, but window.horizon "
            f"is {horizon}; end the layers in a sequence of {horizon} steps (e.g. repeat_vector first)"
        )
    return True


def _head(head: HeadConfig, per_step: bool) -> keras.layers.Layer:
    """A linear Dense per head; float32 so that its output stays float32 under mixed precision."""
    dense = keras.layers.Dense(len(head.columns), dtype="float32", name=head.name)
    return keras.layers.TimeDistributed(dense, dtype="float32", name=head.name) if per_step else dense


def _optimizer(train: TrainConfig) -> keras.optimizers.Optimizer:
    return OPTIMIZERS[train.optimizer](learning_rate=train.learning_rate, clipvalue=train.clipvalue,
                                       clipnorm=train.clipnorm)
