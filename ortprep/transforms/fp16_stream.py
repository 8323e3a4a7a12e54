"""FP16 for models whose weights do not belong in memory: the graph is converted without its
external weights, then every external tensor is streamed from the input's data file to the
output's, converted chunk by chunk. Memory stays at the size of a chunk whatever the weights.

onnxconverter-common only flips the data type of a tensor whose data is external (it has no
bytes to convert), which is exactly the record this needs: the tensors it flipped to float16 are
converted while streaming, the others are copied as they are.

Verification runs both models from disk in child processes (ORT loads the weights there, not
here); the mixed-precision search and the pre-folding of the in-memory path do not run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ortprep.model import ModelHandle, _default_file_mode, check_output_path, is_external, iter_graphs
from ortprep.transforms import fp16 as fp16_step

STREAM_ABOVE = 1 << 30  # external weights above this many bytes are streamed
CHUNK = 16 << 20  # bytes read at a time
ALIGN = 4096  # tensors of 1 MiB or more start at a page boundary (ORT can map them)


@dataclass
class StreamStats:
    converted: int = 0  # tensors written as float16
    copied: int = 0  # tensors copied as they are
    bytes_in: int = 0
    bytes_out: int = 0
    overflow: dict[str, float] = field(default_factory=dict)  # tensor -> largest magnitude clamped to 65504
    underflow: dict[str, int] = field(default_factory=dict)  # tensor -> values that became zero


def external_bytes(handle: ModelHandle) -> int:
    return sum(_length(t) for _, g in iter_graphs(handle.graph) for t in g.initializer if is_external(t))


def streams(handle: ModelHandle, options) -> bool:
    """FP16 alone (no graph rewrites) on a model with more than STREAM_ABOVE of external weights."""
    only_fp16 = options.fp16 and not (options.opset or options.ir_version or options.fix_shapes or options.fix_dims
                                      or options.conv1d_to_conv2d)
    return bool(only_fp16 and handle.path is not None and external_bytes(handle) > STREAM_ABOVE)


def _entries(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _length(tensor: TensorProto) -> int:
    entries = _entries(tensor)
    if "length" in entries:
        return int(entries["length"])
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * np.dtype(_NP[tensor.data_type]).itemsize if tensor.data_type in _NP else 0


_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
       TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}


def output_bytes(source: ModelHandle, converted: ModelProto) -> int:
    """Bytes the streamed data file will take: halved tensors at half their length, the rest whole."""
    originals = {t.name: t for _, g in iter_graphs(source.graph) for t in g.initializer if is_external(t)}
    total = 0
    for _, graph in iter_graphs(converted.graph):
        for tensor in graph.initializer:
            if tensor.name in originals:
                length = _length(originals[tensor.name])
                halve = (
                    originals[tensor.name].data_type == TensorProto.FLOAT and tensor.data_type == TensorProto.FLOAT16
                )
                total += length // 2 if halve else length
    return total


def require_disk(source: ModelHandle, converted: ModelProto, dest: Path) -> None:
    """Refuse, with the numbers, an output the destination's disk cannot hold (before writing any of it)."""
    from ortprep.errors import EnvironmentMissingError

    needed = output_bytes(source, converted)
    folder = Path(dest).resolve().parent
    free = shutil.disk_usage(folder if folder.exists() else Path.cwd()).free
    if needed > free:
        raise EnvironmentMissingError(
            f"convert --fp16 would write {needed / 2**30:.1f} GiB of weights beside {Path(dest).name}; "
            f"{folder} has {free / 2**30:.1f} GiB free", hint="write the output (-o) to a disk with room")


def _to_fp16(values: np.ndarray, name: str, stats: StreamStats) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return _clamped(values, name, stats)


def _clamped(values: np.ndarray, name: str, stats: StreamStats) -> np.ndarray:
    finite = np.isfinite(values)
    magnitude = np.abs(values)
    beyond = finite & (magnitude > fp16_step.FP16_MAX)
    if beyond.any():
        stats.overflow[name] = max(stats.overflow.get(name, 0.0), float(magnitude[beyond].max()))
        values = np.where(beyond, np.sign(values) * fp16_step.FP16_MAX, values)
    tiny = int(np.count_nonzero((magnitude > 0) & (magnitude < fp16_step.FP16_MIN_SUBNORMAL)))
    if tiny:
        stats.underflow[name] = stats.underflow.get(name, 0) + tiny
    return values.astype(np.float16)


def stage(source: ModelHandle, converted: ModelProto, dest: Path, *, force: bool) -> tuple[Path, StreamStats]:
    """Write ``converted`` (a graph whose external tensors still point into ``source``'s data files)
    into a private folder beside ``dest``, as ``dest``'s name and ``dest``.data, streaming each
    external tensor across. Returns the staged model's path; ``commit`` moves it into place,
    ``discard`` removes it."""
    dest = check_output_path(Path(dest), input_path=source.path, force=force)
    originals = {t.name: t for _, g in iter_graphs(source.graph) for t in g.initializer if is_external(t)}
    data_name = f"{dest.name}.data"
    stats = StreamStats()
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".ortprep-tmp", dir=dest.parent))
    try:
        with open(tmp_dir / data_name, "wb") as out:
            handles: dict[str, object] = {}
            try:
                for _, graph in iter_graphs(converted.graph):
                    for tensor in graph.initializer:
                        if not is_external(tensor) or tensor.name not in originals:
                            continue
                        original = originals[tensor.name]
                        entries = _entries(original)
                        location = entries["location"]
                        if location not in handles:
                            handles[location] = open(source.folder / location, "rb")
                        reader = handles[location]
                        reader.seek(int(entries.get("offset", 0)))
                        length = _length(original)
                        halve = original.data_type == TensorProto.FLOAT and tensor.data_type == TensorProto.FLOAT16
                        if length >= 1 << 20 and out.tell() % ALIGN:
                            out.write(b"\0" * (ALIGN - out.tell() % ALIGN))
                        start = out.tell()
                        remaining = length
                        while remaining:
                            block = reader.read(min(CHUNK, remaining))
                            if not block:
                                raise OSError(f"external data of '{tensor.name}' ends early in {location}")
                            remaining -= len(block)
                            if halve:
                                block = _to_fp16(np.frombuffer(block, np.float32), tensor.name, stats).tobytes()
                            out.write(block)
                        stats.bytes_in += length
                        stats.bytes_out += out.tell() - start
                        stats.converted += halve
                        stats.copied += not halve
                        del tensor.external_data[:]
                        for key, value in (
                            ("location", data_name),
                            ("offset", str(start)),
                            ("length", str(out.tell() - start)),
                        ):
                            entry = tensor.external_data.add()
                            entry.key, entry.value = key, value
                        tensor.data_location = TensorProto.EXTERNAL
            finally:
                for reader in handles.values():
                    reader.close()
        tmp_model = tmp_dir / dest.name
        tmp_model.write_bytes(converted.SerializeToString())
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return tmp_model, stats


def commit(staged: Path, dest: Path) -> Path:
    """Move a staged model and its data file into place: the data first, then the model. A
    ``dest`` named otherwise than the staged model (--keep-failed's name) gets its data file
    renamed too, and the graph's references to it rewritten (the graph holds no weights)."""
    data = staged.with_name(staged.name + ".data")
    mode = _default_file_mode()
    try:
        if dest.name != staged.name:
            graph = onnx.load(str(staged), load_external_data=False)
            for _, sub in iter_graphs(graph.graph):
                for tensor in sub.initializer:
                    for entry in tensor.external_data:
                        if entry.key == "location" and entry.value == data.name:
                            entry.value = f"{dest.name}.data"
            onnx.save(graph, str(staged))
            renamed = data.with_name(f"{dest.name}.data")
            os.replace(data, renamed)
            data = renamed
        os.chmod(data, mode)
        os.chmod(staged, mode)
        os.replace(data, dest.parent / data.name)
        os.replace(staged, dest)
    finally:
        discard(staged)
    return dest


def discard(staged: Path) -> None:
    shutil.rmtree(staged.parent, ignore_errors=True)
