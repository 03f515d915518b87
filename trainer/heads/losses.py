"""The losses of the head kinds that Keras has none of (trainer.heads): imported when a head's losses are made, and
by trainer.model.models, so that a process that imported cryptotrain loads a model.keras compiled. Anyone else loads
it with compile=False (inference needs no loss; the model card says so)."""
from __future__ import annotations

import keras


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
