"""The layers a family can list under model.layers: each one a class that knows its parameters (Keras's own
argument names), how to build its Keras layer and how many FLOPs it costs per sample (trainer.model.flops).

A new layer kind is one class here: a subclass of Layer with `kind` a Literal, its parameters as fields,
`build` and, where it changes the shape or does dense algebra, `flops`. Recurrent layers keep Keras's defaults
(tanh / sigmoid, no recurrent dropout, bias, no unroll, use_cudnn="auto"), so they run on cuDNN on a GPU unless
the config sets otherwise. Keras is imported when a layer is built, not when a config is read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from ..specs import Kind

if TYPE_CHECKING:
    import keras


class Layer(Kind):
    """One layer of the trunk. `recurrent`: whether it runs over time steps with a state (device checks these
    for cuDNN)."""
    tag: ClassVar[str] = "kind"
    recurrent: ClassVar[bool] = False
    kind: str

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        """The Keras layer, named `name` (stable: checkpoints load by name); `horizon`: the window's."""
        raise NotImplementedError(f"layer kind {self.kind} has no build()")

    def flops(self, steps: int, width: int, horizon: int) -> tuple[int, int, int]:
        """Forward FLOPs per sample on an input of `steps` x `width`, and the output's steps and width (a
        multiply-add counts as 2 FLOPs; only dense algebra is counted, see trainer.model.flops)."""
        return 0, steps, width

    def keras_args(self, *drop: str) -> dict:
        return self.model_dump(exclude={"kind", *drop})


class _Recurrent(Layer):
    recurrent: ClassVar[bool] = True
    gates: ClassVar[int]  # 4 for an LSTM, 3 for a GRU
    directions: ClassVar[int] = 1
    units: int = Field(gt=0)
    return_sequences: bool = False
    dropout: float = Field(0.0, ge=0, lt=1)
    recurrent_dropout: float = Field(0.0, ge=0, lt=1)
    activation: str = "tanh"
    recurrent_activation: str = "sigmoid"
    use_bias: bool = True
    unroll: bool = False

    def keras_class(self) -> type[keras.layers.Layer]:
        import keras

        return keras.layers.LSTM if self.gates == 4 else keras.layers.GRU

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        return self.keras_class()(**self.keras_args(), name=name)

    def flops(self, steps: int, width: int, horizon: int) -> tuple[int, int, int]:
        """2 x gates x units x (width + units) per time step and direction (kernel + recurrent kernel)."""
        total = self.directions * steps * 2 * self.gates * self.units * (width + self.units)
        return total, steps if self.return_sequences else 1, self.units * self.directions


class _Bidirectional(_Recurrent):
    directions: ClassVar[int] = 2
    merge_mode: Literal["concat", "sum", "mul", "ave"] = "concat"

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.Bidirectional(self.keras_class()(**self.keras_args("merge_mode"), name=name),
                                          merge_mode=self.merge_mode, name=name)

    def flops(self, steps: int, width: int, horizon: int) -> tuple[int, int, int]:
        total, steps, width = super().flops(steps, width, horizon)
        return total, steps, width if self.merge_mode == "concat" else self.units


class LstmLayer(_Recurrent):
    gates: ClassVar[int] = 4
    kind: Literal["lstm"]


class GruLayer(_Recurrent):
    gates: ClassVar[int] = 3
    kind: Literal["gru"]


class BiLstmLayer(_Bidirectional):
    gates: ClassVar[int] = 4
    kind: Literal["bilstm"]


class BiGruLayer(_Bidirectional):
    gates: ClassVar[int] = 3
    kind: Literal["bigru"]


class DenseLayer(Layer):
    kind: Literal["dense"]
    units: int = Field(gt=0)
    activation: str | None = None

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.Dense(**self.keras_args(), name=name)

    def flops(self, steps: int, width: int, horizon: int) -> tuple[int, int, int]:
        return steps * 2 * width * self.units, steps, self.units


class TimeDenseLayer(DenseLayer):
    """A Dense layer applied at every time step (TimeDistributed)."""
    kind: Literal["time_dense"]

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.TimeDistributed(super().build(name, horizon), name=name)


class DropoutLayer(Layer):
    kind: Literal["dropout"]
    rate: float = Field(gt=0, lt=1)

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.Dropout(**self.keras_args(), name=name)


class LayerNormLayer(Layer):
    kind: Literal["layernorm"]
    epsilon: float = Field(1e-3, gt=0)

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.LayerNormalization(**self.keras_args(), name=name)


class RepeatVectorLayer(Layer):
    kind: Literal["repeat_vector"]
    n: int | None = Field(None, gt=0)  # None: the window horizon

    def build(self, name: str, horizon: int) -> keras.layers.Layer:
        import keras

        return keras.layers.RepeatVector(self.n or horizon, name=name)

    def flops(self, steps: int, width: int, horizon: int) -> tuple[int, int, int]:
        return 0, self.n or horizon, width
