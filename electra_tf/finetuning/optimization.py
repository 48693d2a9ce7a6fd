"""Layer-wise learning-rate decay for fine-tuning (official `optimization._get_layer_lrs`).

Each variable gets a depth; its learning rate is lr_t * decay^(max_depth - depth):

    depth 0        embeddings and embeddings_project ("/embeddings/", "/embeddings_project/")
    depth i + 1    transformer layer i ("layer_i/")
    depth L + 2    the task heads ("task_specific/")      max_depth = L + 2

Official quirk (issue #51, called "a small mistake" by the maintainers): depth L + 1 is never
used, a leftover of BERT's removed pooler. So the top transformer layer gets lr * decay^2, not
lr * decay, and the embeddings lr * decay^(L+2). electra-tf reproduces this by default; with
`layerwise_lr_decay_fix: true` the heads sit at depth L + 1 (max_depth = L + 1), closing the gap:
top layer lr * decay, embeddings lr * decay^(L+1), heads lr.

As the official, a trainable variable that matches no key is an error (`check_covered`).
The multipliers are handed to `electra_tf.training.optimizers.AdamWeightDecay`
(`lr_multipliers`: regex -> multiplier, first match wins, matched with re.search against the
variable path, e.g. "electra/layer_3/self_attention_layer/query/kernel").
"""

from __future__ import annotations

import re
from typing import Dict, Sequence

from electra_tf.finetuning.model import ENCODER_NAME, TASK_SCOPE
from electra_tf.training.optimizers import variable_name


def layer_depths(num_hidden_layers: int, fix_depth_gap: bool = False) -> Dict[str, int]:
    """{regex: depth} for the encoder's and the heads' variables."""
    depths = {
        rf"(^|/){ENCODER_NAME}/embeddings/": 0,
        rf"(^|/){ENCODER_NAME}/embeddings_project/": 0,
    }
    for i in range(num_hidden_layers):
        depths[rf"(^|/){ENCODER_NAME}/layer_{i}/"] = i + 1
    depths[rf"(^|/){TASK_SCOPE}/"] = num_hidden_layers + (1 if fix_depth_gap else 2)
    return depths


def layerwise_lr_multipliers(num_hidden_layers: int, decay: float,
                             fix_depth_gap: bool = False) -> Dict[str, float]:
    """{regex: decay^(max_depth - depth)}; {} when decay <= 0 (official: disabled).

    Args:
        num_hidden_layers: int. L, the encoder depth.
        decay: float. Official `layerwise_lr_decay` (0.8 small/base, 0.9 large).
        fix_depth_gap: bool. Put the heads at depth L + 1 instead of L + 2 (issue #51).
    """
    if decay <= 0:
        return {}
    depths = layer_depths(num_hidden_layers, fix_depth_gap)
    max_depth = num_hidden_layers + (1 if fix_depth_gap else 2)
    return {pattern: float(decay ** (max_depth - depth)) for pattern, depth in depths.items()}


def check_covered(variables: Sequence, multipliers: Dict[str, float]) -> None:
    """Raises ValueError naming the first variable no key matches (official behaviour)."""
    if not multipliers:
        return
    for variable in variables:
        name = variable_name(variable)
        if not any(re.search(pattern, name) for pattern in multipliers):
            raise ValueError(f"layer-wise learning rate: variable {name!r} matches no layer key "
                             f"({', '.join(multipliers)})")
