"""The heads of a network, one class per kind (`heads[].kind`), as a layer kind is one class (model/layers.py). A
head owns what its kind means, and every stage calls it without asking which kind it is
(tests/test_no_switches.py):
- config: its Keras outputs (`outputs`), the inputs it reads beside the windows (`input_shapes`), what it needs of
  the rest of the config (`check`);
- windows: whether its columns share one scale (`shares_scale`), its targets' shape (`target_shape`) and the
  targets it derives from them (`derived_targets`), the inputs it reads made from HAR's forecast
  (`forecast_inputs`);
- the model: its Keras layers (`build`), with its warm start holding a reference to the layer it starts
  (`WarmStart`), its losses and their weights, its FLOPs;
- serving: its point forecast (`point`), how it is mixed with its own persistence (`judged`, `shrunk`), the size
  of the coming candles it forecasts (`candle_quantities`), its quantile forecasts (`quantile_forecasts`) and the
  columns `predict` shows (`served_columns`).

Kinds:
  plain       a linear Dense per column (per time step)
  quantile    these quantiles of each column, ordered by construction, trained with the pinball loss; its point
              forecast is the median
  candle      open, high, low, close as a candle by construction: a body and two non-negative wicks
  har_candle  a candle whose high and low excursions, and a log range output of its own, start at HAR + time of
              day's forecast of each step and learn a correction of it (HARNet)

A new kind is one class here: a subclass of Head with its `kind` a Literal and `build`, `losses` and whatever of
the rest its kind means otherwise. Keras is imported when a head is built, not when a config is read.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import numpy as np
from pydantic import Field, field_validator, model_validator

from ..errors import JobError
from ..specs import Kind

if TYPE_CHECKING:
    import keras

CANDLE = ("open", "high", "low", "close")
F32 = {"dtype": "float32"}  # a head stays float32 under mixed precision
Loss = Literal["mse", "mae", "huber"]


def quantities(high: np.ndarray, low: np.ndarray, close: np.ndarray, last_close: np.ndarray) -> dict[str, np.ndarray]:
    """Candle prices (N, H), forecast or actual, and each sample's last close C (N,) -> the size of the coming
    candles: "high" ln(high / C), "low" ln(C / low), "range" ln(high / low), "return" ln(close / C), each (N, H)."""
    log_last = np.log(last_close)[:, None]
    log_high, log_low = np.log(high), np.log(low)
    return {"high": log_high - log_last, "low": log_last - log_low, "range": log_high - log_low,
            "return": np.log(close) - log_last}


class Built(NamedTuple):
    """What a head adds to the network: its outputs by name, and its warm start (None: it starts as built)."""
    outputs: dict[str, Any]
    warm_start: WarmStart | None = None


class WarmStart:
    """Sets a head's layer, which it holds, from the train split before the first epoch: called with the train
    split's batches, each (inputs, targets) as numpy arrays: inputs by model input name ("inputs": the windows),
    targets by output name."""

    def __call__(self, batches: Iterable[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> None:
        raise NotImplementedError


class Head(Kind):
    """One head of the network: a linear layer of the trunk (per time step when the trunk ends in a sequence) that
    forecasts `columns`, trained with its loss times `weight`."""
    tag: ClassVar[str] = "kind"
    default: ClassVar[str] = "plain"  # a head without a kind
    # One scale for its columns framed as levels (windows.make_windows), so that an order between them (a candle's
    # high above its close) holds in scaled units too
    shares_scale: ClassVar[bool] = False
    kind: str
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    columns: list[str] = Field(min_length=1)
    weight: float = Field(1.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _a_kind_not_flags(cls, values: Any) -> Any:
        if isinstance(values, dict) and {"candle", "har"} & values.keys():
            raise ValueError("candle: and har: became the head's kind: kind: candle, or kind: har_candle (a candle "
                             "that starts at HAR + time of day)")
        return values

    @classmethod
    def of(cls, values: dict) -> Head:
        """The head of the kind `values` names (a saved head, preprocessing.json's); ValueError for a kind this
        version does not know."""
        kind = values.get(cls.tag, cls.default)
        if kind not in cls.kinds:
            raise ValueError(f"unknown head kind {kind!r} ({', '.join(cls.kinds)})")
        return cls.kinds[kind].model_validate(values)

    # ------------------------------------------------------------------------- what the config must give it
    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of its Keras outputs (the first is its own: its targets' head)."""
        return (self.name,)

    def input_shapes(self, horizon: int) -> dict[str, tuple[int, ...]]:
        """The model inputs it reads beside the windows, by name, each shape without the batch axis."""
        return {}

    def check(self, relative: bool) -> None:
        """ValueError where the windows cannot give it its targets (`relative`: framed relative to the last
        close)."""

    # ------------------------------------------------------------------------- the model
    def build(self, trunk: keras.KerasTensor, per_step: bool, relative: bool,
              inputs: dict[str, keras.KerasTensor]) -> Built:
        """Its Keras outputs on the trunk; `inputs`: the model's inputs ("inputs": the windows, and the ones it
        reads). Framed relative to the last close, a head starts at zero, i.e. at "no change" (its targets are scaled
        with offset 0, see windows.py): the network learns deviations from the last close, as in NLinear."""
        dense = _dense(trunk, per_step, "zeros" if relative else "glorot_uniform")
        return Built({self.name: dense(len(self.columns), self.name)})

    def losses(self) -> dict[str, object]:
        """Keras loss per output."""
        raise NotImplementedError(f"head kind {self.kind} has no losses()")

    def loss_weights(self) -> dict[str, float]:
        return dict.fromkeys(self.outputs, self.weight)

    def target_shape(self, output_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of its targets, given its output's (without the batch axis)."""
        return output_shape

    def flops(self, steps: int, width: int, n_features: int) -> int:
        """Forward FLOPs per sample on a trunk of `steps` x `width` (trainer.model.flops)."""
        return steps * 2 * width * len(self.columns)

    def derived_targets(self, targets: Any) -> dict[str, Any]:
        """The targets of its other outputs, made from its own scaled targets (numpy or TensorFlow: slices only)."""
        return {}

    # ------------------------------------------------------------------------- serving
    def forecast_inputs(self, har: np.ndarray | None, scale: np.ndarray) -> dict[str, np.ndarray]:
        """The inputs it reads beside the windows (input_shapes), from HAR + time of day's forecasts (N, horizon, 3)
        of each sample's high and low excursions and root-mean-square range (trainer.evaluation.baselines);
        `scale`: its columns' target scales."""
        return {}

    def point(self, output: np.ndarray) -> np.ndarray:
        """Its point forecast from its output, shaped like its targets."""
        return output

    def judged(self) -> list[int]:
        """The positions of its columns whose forecast decides its shrink factor (evaluate.choose_shrink): all of
        them."""
        return list(range(len(self.columns)))

    def shrunk(self, framed: np.ndarray, persistence: np.ndarray, factor: float) -> np.ndarray:
        """Its forecast (framed, unscaled: windows.Framing) mixed with its persistence: persistence + factor x
        (forecast - persistence). `persistence`: each column's last input value framed alike, broadcastable to the
        forecast (Preprocessing.persistence). Factor 0 repeats each column's last value, exactly what the test split
        scores the head against; 1 is the network as it is."""
        return persistence + factor * (np.asarray(framed, dtype=np.float64) - persistence)

    def candle_quantities(self, outputs: dict[str, np.ndarray], prices: np.ndarray, last_close: np.ndarray,
                          scale: np.ndarray) -> dict[str, np.ndarray]:
        """The size of the coming candles it forecasts (quantities: "high", "low", "range", "return", each (N, steps))
        from its forecast candles in prices (N, ..., C), for a head whose columns hold high, low and close."""
        candles = prices.reshape(len(prices), -1, len(self.columns))
        return quantities(*(candles[..., self.columns.index(c)] for c in ("high", "low", "close")), last_close)

    def quantile_forecasts(self, prices: np.ndarray) -> tuple[tuple[float, ...], np.ndarray] | None:
        """Its levels and quantile forecasts in prices (N, ..., Q, C); None: it forecasts no quantiles."""
        return None

    def served_columns(self, point: np.ndarray, prices: np.ndarray, label: Callable[[str], str]) -> dict:
        """What `predict` shows of it: per column `label(column)`, its point forecast (H,) from `point` (H, C);
        `prices`: its outputs in prices (H, ..., C)."""
        return {label(column): point[:, i] for i, column in enumerate(self.columns)}


class PlainHead(Head):
    kind: Literal["plain"]
    loss: Loss = "mse"

    def losses(self) -> dict[str, object]:
        return {self.name: self.loss}


class QuantileHead(Head):
    """These quantiles of each column (e.g. [0.1, 0.5, 0.9]), its outputs (..., Q, C): the lowest, then each next one
    as the one below plus a gap through softplus, so they never cross; trained with the pinball loss. Its point
    forecast is the median (0.5, else the middle level)."""
    kind: Literal["quantile"]
    quantiles: list[float]

    @field_validator("quantiles")
    @classmethod
    def _levels(cls, levels: list[float]) -> list[float]:
        if len(levels) < 2 or not all(0 < q < 1 for q in levels) or any(b <= a for a, b in zip(levels, levels[1:])):
            raise ValueError(f"at least two levels, increasing, each between 0 and 1 (got {levels}), e.g. "
                             "[0.1, 0.5, 0.9]")
        return levels

    @property
    def median(self) -> int:
        """The position of its point forecast among its levels."""
        return self.quantiles.index(0.5) if 0.5 in self.quantiles else len(self.quantiles) // 2

    def build(self, trunk, per_step, relative, inputs) -> Built:
        import keras

        dense = _dense(trunk, per_step, "zeros" if relative else "glorot_uniform")
        columns, shape = len(self.columns), (trunk.shape[1],) if per_step else ()
        quantile = dense(columns, f"{self.name}_q0")
        stacked = [quantile]
        for i in range(1, len(self.quantiles)):
            quantile = keras.layers.Add(**F32)([quantile, dense(columns, f"{self.name}_gap{i}", "softplus")])
            stacked.append(quantile)
        stacked = [keras.layers.Reshape((*shape, 1, columns), **F32)(q) for q in stacked]
        return Built({self.name: keras.layers.Concatenate(axis=-2, name=self.name, **F32)(stacked)})

    def losses(self) -> dict[str, object]:
        from .losses import Pinball

        return {self.name: Pinball(self.quantiles)}

    def target_shape(self, output_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*output_shape[:-2], output_shape[-1])  # without the quantile axis

    def flops(self, steps: int, width: int, n_features: int) -> int:
        return super().flops(steps, width, n_features) * len(self.quantiles)

    def point(self, output: np.ndarray) -> np.ndarray:
        return output[..., self.median, :]

    def shrunk(self, framed: np.ndarray, persistence: np.ndarray, factor: float) -> np.ndarray:
        """Its point forecast (the median) mixed with its persistence as any head's; every quantile of its outputs
        (..., Q, C) moved with the median: its spread is its own."""
        framed = np.asarray(framed, dtype=np.float64)
        if framed.ndim == persistence.ndim:  # the point forecast
            return super().shrunk(framed, persistence, factor)
        median = framed[..., self.median:self.median + 1, :]
        return framed + (1 - factor) * (persistence[..., None, :] - median)

    def quantile_forecasts(self, prices: np.ndarray) -> tuple[tuple[float, ...], np.ndarray]:
        return tuple(self.quantiles), prices

    def served_columns(self, point: np.ndarray, prices: np.ndarray, label: Callable[[str], str]) -> dict:
        levels = prices.reshape(len(point), len(self.quantiles), len(self.columns))
        return {name: values for i, column in enumerate(self.columns)
                for name, values in {label(column): point[:, i],
                                     **{f"{label(column)}_q{level * 100:g}": levels[:, j, i]
                                        for j, level in enumerate(self.quantiles)}}.items()}


class CandleHead(Head):
    """Open, high, low, close as a candle by construction: open and close, and two wicks through softplus (never
    negative): high = max(open, close) + upper wick, low = min(open, close) - lower wick. Its columns share one
    scale, so the candle is consistent in prices too. Shrunk, its body moves toward "no change" and its wicks
    stay. Its persistence is the last candle's close for the body (the close's last value, and where the next candle
    opens: a new candle's open is the last close, not the last open)."""
    kind: Literal["candle"]
    shares_scale: ClassVar[bool] = True
    loss: Loss = "mse"

    @field_validator("columns")
    @classmethod
    def _candle_columns(cls, columns: list[str]) -> list[str]:
        if sorted(columns) != sorted(CANDLE):
            raise ValueError(f"a candle head needs exactly the columns {', '.join(CANDLE)} (got {', '.join(columns)})")
        return columns

    def check(self, relative: bool) -> None:
        if not relative:
            raise ValueError("a candle head needs window.relative_to: last_close")

    def build(self, trunk, per_step, relative, inputs) -> Built:
        import keras

        dense = _dense(trunk, per_step, "zeros")
        open_, close = dense(1, f"{self.name}_open"), dense(1, f"{self.name}_close")
        upper = dense(1, f"{self.name}_upper_wick", "softplus")
        lower = dense(1, f"{self.name}_lower_wick", "softplus")
        return Built({self.name: self._candle(
            open_, close, keras.layers.Add(**F32)([keras.layers.Maximum(**F32)([open_, close]), upper]),
            keras.layers.Subtract(**F32)([keras.layers.Minimum(**F32)([open_, close]), lower]))})

    def _candle(self, open_, close, high, low) -> keras.KerasTensor:
        import keras

        parts = {"open": open_, "close": close, "high": high, "low": low}
        return keras.layers.Concatenate(name=self.name, **F32)([parts[column] for column in self.columns])

    def losses(self) -> dict[str, object]:
        return {self.name: self.loss}

    def judged(self) -> list[int]:
        return [self.columns.index(c) for c in ("open", "close")]

    def body_shrunk(self, out: np.ndarray, persistence: np.ndarray, factor: float) -> None:
        """Its body (open and close, in place in `out`) mixed with the close's persistence, the last close."""
        o, c = self.columns.index("open"), self.columns.index("close")
        last_close = persistence[..., [c]]
        out[..., [o, c]] = last_close + factor * (out[..., [o, c]] - last_close)

    def shrunk(self, framed: np.ndarray, persistence: np.ndarray, factor: float) -> np.ndarray:
        out = np.array(framed, dtype=np.float64)
        o, h, low, c = (self.columns.index(column) for column in CANDLE)
        upper = out[..., h] - np.maximum(out[..., o], out[..., c])  # >= 0: the model's candles are candles
        lower = np.minimum(out[..., o], out[..., c]) - out[..., low]
        self.body_shrunk(out, persistence, factor)
        out[..., h] = np.maximum(out[..., o], out[..., c]) + upper
        out[..., low] = np.minimum(out[..., o], out[..., c]) - lower
        return out


# The inputs a HAR-started candle head reads beside the windows: HAR + time of day's forecast of each step (fitted on
# the train split, trainer.evaluation.baselines), each (horizon, 1): the high excursion, minus the low excursion and
# the root-mean-square log range, in the head's scaled units
HAR_INPUTS = ("har_high", "har_low", "har_range")
class HarCandleHead(CandleHead):
    """A candle head that starts at HAR + time of day (HARNet, Reisenhofer, Bayer & Hautsch 2022): its high and low
    excursions and a log range output of its own (`{name}_range`) are HAR's forecast of each step (the HAR_INPUTS)
    times exp(c), one correction of the coming volatility per step: tanh of a Dense of the trunk plus a Dense of the
    window's last input row less the window's mean (what HAR's regression could add linearly: a volume or market
    surprise, its own terms reweighed; less the mean, so that a level the train split never saw - a regime of high
    volatility, which HAR's own terms already carry - is not extrapolated), both zero as built; its warm start sets
    the linear one to its ridge least-squares fit on the train split (CorrectionStart). tanh bounds the correction
    to a factor of e^-1 .. e^1. Untrained, it forecasts exactly HAR's high, low and range, and a body of open = close
    = the last close ("no change"); high = max(open, close, HAR's high x exp(c)), low = min(open, close, -HAR's low x
    exp(c)): a candle. The range is trained on QLIKE (its forecast: the root-mean-square range), the excursions on
    the head's loss (mae: their medians). Shrunk, its body moves toward "no change" and its high and low, excursions
    from the last close, stay (wrapping the body)."""
    kind: Literal["har_candle"]
    # The ridge of its warm start, per train window: each coefficient shrunk by about var / (var + ridge), var the
    # variance of its input over the train split (about half with V7's and V8-aligned's standardised inputs, less with
    # V8-stable's min-max scaled ones). Chosen on the validation split's figures, of 0.01, 0.1 and 1.0
    # (benchmarks/RESULTS.md, "bench-skill", 2026-11-27, issue 35)
    ridge: float = Field(0.01, gt=0)
    # What its linear correction reads: the window's last input row less the window's mean ("surprise"), or the last
    # row as it is ("last"). Chosen on BTCUSDT 15m's test figure; kept on validation alone since (docs/model-quality.md,
    # "Which split chose what")
    correction_input: Literal["surprise", "last"] = "surprise"

    @property
    def range_output(self) -> str:
        return f"{self.name}_range"

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.name, self.range_output)

    def input_shapes(self, horizon: int) -> dict[str, tuple[int, ...]]:
        return dict.fromkeys(HAR_INPUTS, (horizon, 1))

    def build(self, trunk, per_step, relative, inputs) -> Built:
        import keras

        dense = _dense(trunk, per_step, "zeros")
        open_, close = dense(1, f"{self.name}_open"), dense(1, f"{self.name}_close")
        steps, window = trunk.shape[1] if per_step else 1, inputs["inputs"]
        last_row = keras.layers.Flatten(**F32)(keras.layers.Cropping1D((window.shape[1] - 1, 0), **F32)(window))
        surprise = last_row if self.correction_input == "last" else \
            keras.layers.Subtract(**F32)([last_row, keras.layers.GlobalAveragePooling1D(**F32)(window)])
        har = {name: inputs[name] if per_step else keras.layers.Reshape((1,), **F32)(inputs[name])
               for name in HAR_INPUTS}  # horizon 1 on a trunk that ends in one vector: (batch, 1, 1) -> (batch, 1)
        linear_layer = keras.layers.Dense(steps, kernel_initializer="zeros", name=f"{self.name}_correction_linear",
                                          **F32)
        linear = linear_layer(surprise)
        if per_step:
            linear = keras.layers.Reshape((steps, 1), **F32)(linear)
        correction = keras.layers.Activation("tanh", **F32)(
            keras.layers.Add(**F32)([dense(1, f"{self.name}_correction"), linear]))
        scale = keras.layers.Activation("exponential", **F32)(correction)
        candle = self._candle(
            open_, close,
            keras.layers.Maximum(**F32)([open_, close, keras.layers.Multiply(**F32)([har["har_high"], scale])]),
            keras.layers.Minimum(**F32)([open_, close, keras.layers.Multiply(**F32)([har["har_low"], scale])]))
        range_ = keras.layers.Multiply(name=self.range_output, **F32)([har["har_range"], scale])
        return Built({self.name: candle, self.range_output: range_}, CorrectionStart(linear_layer, self))

    def losses(self) -> dict[str, object]:
        from .losses import Qlike

        return {**super().losses(), self.range_output: Qlike()}

    def flops(self, steps: int, width: int, n_features: int) -> int:
        # open, close and the correction per step on the trunk; the linear term of the last input row
        return steps * 2 * width * 3 + 2 * n_features * steps

    def derived_targets(self, targets: Any) -> dict[str, Any]:
        high, low = (self.columns.index(c) for c in ("high", "low"))
        # ln(high / low), scaled as the high is: the columns share one scale
        return {self.range_output: targets[..., high:high + 1] - targets[..., low:low + 1]}

    def forecast_inputs(self, har: np.ndarray | None, scale: np.ndarray) -> dict[str, np.ndarray]:
        if har is None:
            raise JobError(f"head '{self.name}' starts at HAR + time of day: its model reads HAR's forecast of each "
                           "window, which was not given")
        high, low = (scale[self.columns.index(c)] for c in ("high", "low"))
        # the high, minus the low (as the head's high and low are scaled: log ratios to the last close over the
        # candle's shared scale, offset 0) and the range (the high's scale)
        scaled = np.asarray(har, np.float64) / np.array([high, -low, high])
        return {name: np.ascontiguousarray(scaled[..., [i]], np.float32) for i, name in enumerate(HAR_INPUTS)}

    def shrunk(self, framed: np.ndarray, persistence: np.ndarray, factor: float) -> np.ndarray:
        out = np.array(framed, dtype=np.float64)
        o, h, low, c = (self.columns.index(column) for column in CANDLE)
        self.body_shrunk(out, persistence, factor)
        out[..., h] = np.maximum(out[..., h], np.maximum(out[..., o], out[..., c]))
        out[..., low] = np.minimum(out[..., low], np.minimum(out[..., o], out[..., c]))
        return out

    def candle_quantities(self, outputs, prices, last_close, scale) -> dict[str, np.ndarray]:
        """Its range is its range output (a root-mean-square forecast of ln(high / low)), not its candle's."""
        forecast = np.asarray(outputs[self.range_output], np.float64).reshape(len(prices), -1)
        return {**super().candle_quantities(outputs, prices, last_close, scale),
                "range": forecast * scale[self.columns.index("high")]}


@dataclass(frozen=True, eq=False)
class CorrectionStart(WarmStart):
    """A HAR head's warm start: its linear correction term (the Dense of its correction input, `layer`: the window's
    last input row less the window's mean, or the row alone) at its ridge least-squares fit over the train split: per
    step, ln(the actual range / HAR's root-mean-square range) on those inputs, centred, so that over the train split
    the correction's mean is still 0 and the head still forecasts HAR's level. The term SGD would otherwise have to
    find from zero, a few thousandths of the learning rate a step, in the epoch or two before the trunk's term starts
    to fit noise (HAR itself is fitted by least squares too). A train split without a candle with a range leaves it
    as built."""
    layer: keras.layers.Dense
    head: HarCandleHead

    def __call__(self, batches) -> None:
        surprises, ranges, hars = [], [], []
        for inputs, targets in batches:
            window = np.asarray(inputs["inputs"], np.float64)
            surprises.append(window[:, -1] if self.head.correction_input == "last" else
                             window[:, -1] - window.mean(axis=1))
            ranges.append(np.asarray(targets[self.head.range_output]).reshape(len(window), -1))
            hars.append(np.asarray(inputs["har_range"]).reshape(len(window), -1))
        if not surprises:
            return
        surprise, actual, har = (np.concatenate(parts).astype(np.float64) for parts in (surprises, ranges, hars))
        if not (actual > 0).any():
            return
        residual = np.log(np.maximum(actual, actual[actual > 0].min()) / har)  # the floor: as HAR's, a flat candle's
        mean = surprise.mean(axis=0)
        centred = surprise - mean
        kernel = np.linalg.solve(centred.T @ centred + self.head.ridge * len(surprise) * np.eye(len(mean)),
                                 centred.T @ (residual - residual.mean(axis=0)))
        self.layer.set_weights([kernel.astype(np.float32), (-mean @ kernel).astype(np.float32)])


def _dense(trunk: keras.KerasTensor, per_step: bool, init: str) -> Callable[..., keras.KerasTensor]:
    """A head's Dense of `units` on the trunk (per time step when it ends in a sequence), float32."""
    import keras

    def dense(units: int, name: str, activation: str | None = None) -> keras.KerasTensor:
        layer = keras.layers.Dense(units, activation=activation, kernel_initializer=init, dtype="float32",
                                   name=name)
        return (keras.layers.TimeDistributed(layer, dtype="float32", name=name) if per_step else layer)(trunk)

    return dense

