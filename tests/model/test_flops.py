"""FLOPs per sample from the config alone, checked by hand for the tiny config and, for every layer kind
and the three real families, against the kernels and input shapes of the model Keras actually builds."""
from __future__ import annotations

import math

import keras
import pytest

from tests.conftest import tiny_config_dict
from trainer.config import RunConfig, load_config
from trainer.model.flops import flops_per_sample
from trainer.model.models import build_model

pytestmark = pytest.mark.usefixtures("fresh_keras_session")


def keras_flops(model: keras.Model) -> int:
    """2 x every kernel's size x the time steps its layer is applied to, read off the built model."""
    total = 0
    for layer in model.layers:
        kernels = [w for w in layer.weights if w.name in ("kernel", "recurrent_kernel")]
        if kernels:
            steps = math.prod(layer.input.shape[1:-1])  # 1 for a (batch, width) input
            total += sum(2 * steps * math.prod(w.shape) for w in kernels)
    return total


def test_tiny_config_by_hand(tmp_path):
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path))
    # 8 inputs, lookback 16, horizon 3: LSTM 8 -> LayerNorm -> RepeatVector(3) -> LSTM 8 (seq)
    # -> per-step heads ohlc 4 + bb 2.
    expected = (16 * 2 * 4 * 8 * (8 + 8)       # LSTM over the 16 steps of 8 inputs
                + 3 * 2 * 4 * 8 * (8 + 8)      # decoder LSTM over the 3 repeated steps
                + 3 * 2 * 8 * (4 + 2))         # heads, per step
    assert flops_per_sample(cfg.network) == expected


def test_every_layer_kind_matches_keras(tmp_path):
    layers = [
        {"kind": "bigru", "units": 6, "return_sequences": True, "merge_mode": "sum"},
        {"kind": "time_dense", "units": 5, "activation": "relu"},
        {"kind": "dense", "units": 7},  # a Dense on a sequence applies per step
        {"kind": "dropout", "rate": 0.1},
        {"kind": "gru", "units": 7},
        {"kind": "dense", "units": 9, "activation": "relu"},
        {"kind": "layernorm"},
        {"kind": "repeat_vector", "n": 3},
        {"kind": "bilstm", "units": 4, "return_sequences": True},
        {"kind": "lstm", "units": 5, "return_sequences": True},
    ]
    cfg = RunConfig.model_validate(tiny_config_dict(tmp_path, model={"layers": layers}))
    assert flops_per_sample(cfg.network) == keras_flops(build_model(cfg.network, cfg.train))


@pytest.mark.parametrize("family", ["v7", "v8_aligned", "v8_stable"])
def test_real_families_match_keras(family):
    cfg = load_config(family)
    assert flops_per_sample(cfg.network) == keras_flops(build_model(cfg.network, cfg.train))
