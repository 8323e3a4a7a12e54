"""The options ``package`` shares with the step commands, from the same groups (options/groups.py):
its --calib, --shape, --metric, --device and --runtime parse, check and read as theirs do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortprep.options.fields import StepOptions
from ortprep.options.groups import data_option, device_option, metrics_option, runtimes_option, shapes_option
from ortprep.options.steps import RUNTIMES_RUN_HELP, SHAPES_HELP


@dataclass
class PackageSharedOptions(StepOptions):
    """Not a step's: the part of ``ortprep package``'s command line that step commands have too."""

    calib: str | Path | None = data_option("Calibration data for quantized targets (qnn): a folder of .npz/.npy "
                                           "samples or images.")
    shapes: dict[str, list[int]] = shapes_option(SHAPES_HELP)
    metrics: dict[str, str] = metrics_option("held to each variant")
    device: str | None = device_option()
    runtimes: dict[str, Path] = runtimes_option(RUNTIMES_RUN_HELP)
