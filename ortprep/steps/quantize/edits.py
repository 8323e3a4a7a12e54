# SHIM(integration): re-exports ortprep.transforms.qdq (prepare, encodings, facts) for steps/quantize/evaluate.py
"""Moved to :mod:`ortprep.transforms.qdq`; the lead removes this shim after merging."""

from ortprep.transforms.qdq.facts import (  # noqa: F401
    QUANT_OPS,
    QUANTIZED_OPS,
    BLOCK_QUANTIZED_OPS,
    INT_TYPES,
    with_outputs,
    float_weighted,
    quantization_stats,
    INTEGER_WEIGHT_TYPES,
    WEIGHT_READERS,
    int8_compute_matmuls,
    output_writers,
)
from ortprep.transforms.qdq.encodings import (  # noqa: F401
    BOUNDED_OUTPUT_OPS,
    OUTPUT_HEADROOM_16,
    widen_activation_encodings,
    floor_weight_scales,
    fp16_activation_matmuls,
)
from ortprep.transforms.qdq.prepare import (  # noqa: F401
    SENTINEL,
    constants_to_initializers,
    name_nodes,
    sentinel_readers,
    upgrade_opset,
    already_quantized,
    fold_conv_transpose_bias,
    fold_batch_norms,
)
