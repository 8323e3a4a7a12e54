"""Calibration data: found on disk, checked against the model before any work, read one sample
at a time (so memory does not grow with the number of samples).

Sources:
- a folder of .npz files, one sample each, keys = input names;
- a folder of .npy files, one sample each, for single-input models;
- one .npz whose arrays carry a leading sample axis;
- a folder of images (needs Pillow), resized and normalized as asked;
- "random": seeded random samples (only when asked for explicitly).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ortprep.errors import EnvironmentMissingError, UsageError
from ortprep.options.steps import ImageOptions
from ortprep.runtime.feeds import InputSpec, concrete_shape, random_feeds

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


@dataclass
class CalibrationSet:
    """Where the samples are; JSON-serializable so a child process can read them too."""

    kind: str  # "npz-files", "npy-files", "npz-stacked", "images", "random"
    source: str
    files: list[str] = field(default_factory=list)
    count: int = 0
    inputs: list[dict] = field(default_factory=list)  # name, dtype, shape of each model input
    image: dict | None = None
    seed: int = 0
    _stacked: dict | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("_stacked")
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CalibrationSet":
        return cls(**data)

    def specs(self) -> list[InputSpec]:
        return [InputSpec(i["name"], np.dtype(i["dtype"]), tuple(i["shape"])) for i in self.inputs]

    def sample(self, index: int) -> dict[str, np.ndarray]:
        """Sample ``index`` as model feeds."""
        specs = self.specs()
        if self.kind == "random":
            return random_feeds(specs, seed=self.seed + index)
        if self.kind == "npz-files":
            with np.load(self.files[index], allow_pickle=False) as data:
                return {spec.name: data[spec.name] for spec in specs}
        if self.kind == "npy-files":
            return {specs[0].name: np.load(self.files[index], allow_pickle=False)}
        if self.kind == "npz-stacked":
            # A stacked .npz cannot be memory-mapped: it is read once and kept (use a folder of
            # per-sample files for sets larger than memory).
            if self._stacked is None:
                self._stacked = _load_npz(Path(self.files[0]))
            return {spec.name: _take(self._stacked[spec.name], index, spec) for spec in specs}
        if self.kind == "images":
            return {specs[0].name: _load_image(Path(self.files[index]), specs[0], ImageOptions(**self.image))}
        raise ValueError(self.kind)

    def samples(self, indices: list[int]) -> Iterator[dict[str, np.ndarray]]:
        for index in indices:
            yield self.sample(index)


def _take(array: np.ndarray, index: int, spec: InputSpec) -> np.ndarray:
    rank = len(spec.shape) if spec.shape is not None else array.ndim - 1
    if array.ndim == rank + 1:
        return array[index]
    return array[index : index + 1]  # the sample axis doubles as the batch axis


def _spec_record(spec: InputSpec) -> dict:
    return {"name": spec.name, "dtype": str(spec.dtype), "shape": list(spec.shape) if spec.shape is not None else None}


def _check_array(name: str, array: np.ndarray, spec: InputSpec, where: str) -> None:
    if array.dtype != spec.dtype:
        raise UsageError(
            f"calibration input '{name}' is {array.dtype} in {where}; the model wants {spec.dtype}",
            hint=f"save it as {spec.dtype}",
        )
    if spec.shape is None:
        return
    wanted = ["?" if not isinstance(d, int) or d <= 0 else d for d in spec.shape]
    if array.ndim != len(spec.shape) or any(
        isinstance(d, int) and d > 0 and array.shape[i] != d for i, d in enumerate(spec.shape)
    ):
        raise UsageError(
            f"calibration input '{name}' has shape {list(array.shape)} in {where}; the model wants {wanted}",
            hint="fix the array's shape",
        )


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(f"cannot read calibration file {path}: {exc}", hint="write it with numpy.savez") from exc


def _check_sample(sample: dict[str, np.ndarray], specs: list[InputSpec], where: str) -> None:
    names = [s.name for s in specs]
    for spec in specs:
        if spec.name not in sample:
            raise UsageError(
                f"{where} has no array for model input '{spec.name}' (it has: {', '.join(sample) or 'none'})",
                hint=f"name the arrays after the model inputs: {', '.join(names)}",
            )
        _check_array(spec.name, sample[spec.name], spec, where)
    extra = sorted(set(sample) - set(names))
    if extra:
        raise UsageError(
            f"{where} has arrays the model does not take: {', '.join(extra)}",
            hint=f"the model's inputs are: {', '.join(names)}",
        )


def _load_image(path: Path, spec: InputSpec, options: ImageOptions) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise EnvironmentMissingError(
            "reading calibration images needs Pillow", hint="pip install pillow, or pass .npz/.npy samples"
        ) from None
    shape = spec.shape or ()
    if options.size is not None:
        height, width = options.size
    elif options.layout == "nchw" and len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]):
        height, width = shape[2], shape[3]
    elif options.layout == "nhwc" and len(shape) == 4 and all(isinstance(d, int) for d in shape[1:3]):
        height, width = shape[1], shape[2]
    else:
        raise UsageError(f"cannot tell the image size for input '{spec.name}'", hint="give --image-size H,W")
    with Image.open(path) as image:
        array = np.asarray(image.convert("RGB").resize((width, height)), dtype=np.float32)
    array = (array * options.scale - np.asarray(options.mean, np.float32)) / np.asarray(options.std, np.float32)
    if options.layout == "nchw":
        array = array.transpose(2, 0, 1)
    return array[np.newaxis].astype(spec.dtype)


def discover(
    path: str, specs: list[InputSpec], *, image: ImageOptions | None = None, random_count: int = 32
) -> CalibrationSet:
    """Find and check the calibration samples at ``path`` ("random" for seeded random data).

    Every sample is read once here and checked (names, shapes, dtypes), one at a time."""
    records = [_spec_record(s) for s in specs]
    if any(s.dtype is None for s in specs):
        raise UsageError("the model has non-tensor inputs", hint="calibration needs tensor inputs")
    if path == "random":
        for spec in specs:
            concrete_shape(spec)  # symbolic dims get defaults; unknown ranks fail here
        return CalibrationSet("random", "random", count=random_count, inputs=records)
    location = Path(path).resolve()
    if not location.exists():
        raise UsageError(
            f"calibration data not found: {location}", hint="pass a folder of .npz/.npy files, a .npz, or 'random'"
        )
    if location.is_file():
        if location.suffix != ".npz":
            raise UsageError(f"calibration file {location} is not a .npz", hint="pass a .npz or a folder of samples")
        from ortprep.resources import available_memory

        available = available_memory()
        if available is not None and location.stat().st_size > available // 2:
            raise UsageError(
                f"calibration file {location.name} holds {location.stat().st_size / 2**30:.1f} GiB, read whole; this "
                f"machine has {available / 2**30:.1f} GiB available",
                hint="split it into a folder of .npz files (one sample each), which is read one sample at a time")
        arrays = _load_npz(location)
        counts = set()
        for spec in specs:
            if spec.name not in arrays:
                raise UsageError(
                    f"{location.name} has no array for model input '{spec.name}' (it has: "
                    f"{', '.join(arrays) or 'none'})",
                    hint="name the arrays after the model inputs",
                )
            counts.add(arrays[spec.name].shape[0] if arrays[spec.name].ndim else 0)
        if len(counts) != 1 or 0 in counts:
            raise UsageError(
                f"the arrays in {location.name} disagree on the number of samples",
                hint="stack the same number of samples for every input",
            )
        result = CalibrationSet("npz-stacked", str(location), files=[str(location)], count=counts.pop(), inputs=records)
        for index in range(result.count):
            _check_sample(
                {s.name: _take(arrays[s.name], index, s) for s in specs}, specs, f"sample {index} of {location.name}"
            )
        return result
    files = sorted(p for p in location.iterdir() if p.is_file())
    npz = [p for p in files if p.suffix == ".npz"]
    npy = [p for p in files if p.suffix == ".npy"]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if not (npz or npy or images):
        raise UsageError(
            f"calibration folder {location} has no .npz, .npy or image files",
            hint="write one .npz per sample with numpy.savez(path, **{input_name: array})",
        )
    if npz:
        result = CalibrationSet("npz-files", str(location), files=[str(p) for p in npz], count=len(npz), inputs=records)
        for file in npz:
            _check_sample(_load_npz(file), specs, file.name)
        return result
    if len(specs) != 1:
        raise UsageError(
            f"the model has {len(specs)} inputs; .npy and image samples work for single-input models only",
            hint="write one .npz per sample instead",
        )
    if npy:
        for file in npy:
            try:
                array = np.load(file, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise UsageError(
                    f"cannot read calibration file {file}: {exc}", hint="write it with numpy.save"
                ) from exc
            _check_array(specs[0].name, array, specs[0], file.name)
        return CalibrationSet("npy-files", str(location), files=[str(p) for p in npy], count=len(npy), inputs=records)
    options = image or ImageOptions()
    result = CalibrationSet(
        "images",
        str(location),
        files=[str(p) for p in images],
        count=len(images),
        inputs=records,
        image=asdict(options),
    )
    _check_array(specs[0].name, result.sample(0), specs[0], images[0].name)
    return result


def split(count: int, holdout: float = 0.2) -> tuple[list[int], list[int]]:
    """(calibration indices, evaluation indices): every fifth sample is held back (at least one,
    when there are two or more)."""
    if count < 2:
        return list(range(count)), []
    step = max(2, round(1 / holdout)) if holdout > 0 else count + 1
    evaluation = [i for i in range(count) if i % step == step - 1] or [count - 1]
    held = set(evaluation)
    return [i for i in range(count) if i not in held], evaluation
