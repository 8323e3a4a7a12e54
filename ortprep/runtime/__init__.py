"""Everything that touches ONNX Runtime lives here, imported lazily."""
