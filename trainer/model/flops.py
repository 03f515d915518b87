"""FLOPs per sample of a config's model, from its layer sizes alone (no TensorFlow).

Formula (a multiply-add counts as 2 FLOPs; only the dense algebra is counted):
  Dense / time_dense, input width d, u units:   2*d*u          per time step it is applied to
  LSTM, input width d, u units:                 2*4u*(d + u)   per time step (4 gates, kernel + recurrent kernel)
  GRU:                                          2*3u*(d + u)   per time step (3 gates)
  Bidirectional:                                2x its direction's count; output width 2u (concat) else u
  Heads: each its own count (trainer.heads: Head.flops), e.g. a linear Dense(len(columns)) per time step when
  the trunk ends in a sequence.
Bias adds, activations, element-wise gate arithmetic, LayerNorm and Dropout are left out: ~20 FLOPs per
LSTM unit and step against 8*(d + u) for its matmuls, a few per cent at these layer sizes.
Training costs about TRAINING_MULTIPLIER x forward (the backward pass does two matmuls, for the input and
the weight gradients, per forward matmul).
"""
from __future__ import annotations

from .settings import NetworkSpec

TRAINING_MULTIPLIER = 3


def flops_per_sample(spec: NetworkSpec) -> int:
    """Forward FLOPs for one input window of lookback steps x n_features: each layer's own count
    (trainer.model.layers), then the heads."""
    steps, width = spec.lookback, spec.n_features  # steps = 1 once the sequence is collapsed
    total = 0
    for layer in spec.model.layers:
        flops, steps, width = layer.flops(steps, width, spec.horizon)
        total += flops
    return total + sum(head.flops(steps, width, spec.n_features) for head in spec.heads)
