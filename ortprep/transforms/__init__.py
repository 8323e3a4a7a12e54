"""Graph work the steps share: FP16 internals, rewrites, verification of a result."""
