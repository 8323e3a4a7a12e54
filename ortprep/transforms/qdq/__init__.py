"""Graph-only QDQ work for quantize: preparing a float graph for ORT's quantizer
(:mod:`.prepare`), editing the encodings it wrote (:mod:`.encodings`), and reading a quantized
graph (:mod:`.facts`). ONNX protos only: no sessions, no processes."""
