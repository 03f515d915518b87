"""Whether a GPU can run each recurrent layer of a config on the fused cuDNN kernel, from its settings alone (no
TensorFlow): what `plan`, `doctor` and a run's start say of it."""
from __future__ import annotations

from dataclasses import dataclass

from .settings import ModelConfig


@dataclass(frozen=True)
class LayerEligibility:
    index: int  # position in the config's model.layers
    kind: str
    eligible: bool
    blockers: list[str]  # each setting that keeps it off the fused kernel: "recurrent_dropout=0.2 (needs 0)"


# Keras's conditions for the fused cuDNN LSTM/GRU kernel (keras.src.backend.tensorflow.rnn.cudnn_ok,
# plus no recurrent dropout): setting -> the value it needs.
_CUDNN_NEEDS = {"activation": "tanh", "recurrent_activation": "sigmoid", "recurrent_dropout": 0,
                "unroll": False, "use_bias": True}


def cudnn_report(model: ModelConfig) -> list[LayerEligibility]:
    """For every recurrent layer of the config, whether a GPU can run it on the fused cuDNN kernel."""
    report = []
    for index, layer in enumerate(model.layers):
        if not layer.recurrent:
            continue
        blockers = [f"{setting}={getattr(layer, setting)} (needs {needed})"
                    for setting, needed in _CUDNN_NEEDS.items() if getattr(layer, setting) != needed]
        report.append(LayerEligibility(index, layer.kind, not blockers, blockers))
    return report
