"""Model packages: one model, one variant per target, each with the proofs that were run, in
ONNX Runtime's model package layout (a folder with ``manifest.json``; ORT 1.32 reads it and picks
the variant that fits each EP device).

    package/
      manifest.json              ORT's manifest; additional_metadata.ortprep: source, reference
      model/component.json       the variants, in the order ORT prefers them
      model/cpu/model.onnx       float: the source model, proven to load on the CPU EP
      model/cuda/model.onnx      FP16 (convert --fp16 --ep cuda, verified)
      model/qnn/model.onnx       EPContext (compile --ep qnn), with QNN's compatibility string
      model/qnn-qdq/model.onnx   its QDQ source (quantize --static --ep qnn), for devices the
                                 compiled binary does not fit

What each target gets (:data:`KIND_BY_EP`): float for the CPU EPs and OpenVINO (which converts
itself), FP16 for the GPU EPs and DirectML's NPU, QDQ (+ EPContext) for QNN. Every variant is
made by ortprep's own steps, so it passes their gates; then ``check`` gives its placement, and
``load`` runs it on the EP where the EP runs here. A target whose variant fails its gate stops
the package: nothing is written. The package is staged beside the destination and renamed into
place.

``load --package`` (:func:`load_package`) asks the installed ORT which variant each available EP
gets, then proves that variant there.

A list of one-target pipelines, like a repository run: this module stands above the pipeline.

Modules: targets.py (the request), build.py (making and proving the variants), manifest.py (ORT's
manifest and each variant's proofs), load.py (``load --package``).
"""

from ortprep.packaging.build import PackageReport, build_package
from ortprep.packaging.load import PackageLoad, load_package, read_package, variant_file
from ortprep.packaging.targets import (
    COMPILED,
    COMPONENT,
    DEVICE_BY_EP,
    KIND_BY_EP,
    LOAD_SCHEMA,
    MODEL_FILE,
    SCHEMA,
    PackageOptions,
    PackageTarget,
    VariantOutcome,
    targets_from,
)

__all__ = ["COMPILED", "COMPONENT", "DEVICE_BY_EP", "KIND_BY_EP", "LOAD_SCHEMA", "MODEL_FILE", "SCHEMA", "PackageLoad",
           "PackageOptions", "PackageReport", "PackageTarget", "VariantOutcome", "build_package", "load_package",
           "read_package", "targets_from", "variant_file"]
