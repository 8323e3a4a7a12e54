"""ortprep's benchmarks, a package run as modules from the repository root (`python -m bench.suite.journey`).

- ``suite/``: what ``make bench`` runs (``bench.suite.run_all``); each script writes its own results table
  under ``bench/suite/results/``;
- ``studies/``: dated one-off studies, frozen, each with its conclusion at the top of its docstring;
- ``referee.py``: the bench's own judge (compare, decide, NMS, intervals), independent of ortprep's;
- ``common.py``, ``realistic.py``, ``paths.py``: generated models and measurement, realistic inputs, locations.

Nothing here is imported at package import: the apps' own environment (bench/out/apps-venv) imports
``bench.suite.apps`` without ortprep or onnx.
"""
