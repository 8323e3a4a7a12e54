"""The one judging API: whether a candidate model computes what its reference computes.

- compare.py: array comparison (cosine, norm ratio, max abs/rel diff, degenerate outputs);
- graph.py: what the graph says of an output (its maker, its bounds, its quantization grid);
- tolerances.py: what an EP's output is held to against the CPU EP's run of the same model;
- decisions/: what an application reads from each output, one module per kind, and a registry;
- gate.py: the transform gate (convert, simplify, optimize, opset upgrades): judge_run;
- ep_match.py: an EP's run against the CPU EP's (load, compile, quantize's EP side): judge_ep_outputs,
  judge_ep_samples;
- quantized.py, evaluation.py: quantize's gate (judge_quantized) and its evaluation record;
- words.py: judgements in words for findings.

Numpy (and onnx's numpy_helper for a DequantizeLinear's scale) only: fidelity runs no model; its
callers run them (ortprep.runtime) and hand it the outputs.
"""
