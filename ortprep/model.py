"""ModelHandle: open ONNX models safely, walk their graphs, save them atomically.

Opening never reads external weight bytes unless asked (``load_weights=True``), and
refuses external-data locations that leave the model's folder. Saving always goes
through a private temp folder beside the destination and a rename, external data
included, so a reader never sees a half-written model and the input is never lost.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import string
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from ortprep.errors import ModelReadError, OutputPathError, UnsafeExternalDataError
from ortprep.tensor_bytes import dtype_name, element_bits, tensor_defect  # noqa: F401 - dtype_name re-exported

log = logging.getLogger(__name__)

DEFAULT_DOMAIN = "ai.onnx"
STANDARD_DOMAINS = frozenset({"ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.training"})
ORT_CONTRIB_DOMAINS = frozenset(
    {"com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental", "com.ms.internal.nhwc", "com.microsoft.dml"}
)
# Protobuf cannot serialize a message of 2 GiB or more; stay clear of it.
PROTO_LIMIT_BYTES = 2**31 - 1
AUTO_EXTERNAL_THRESHOLD = int(1.8 * 2**30)
# Tensors smaller than this stay inside the .onnx file when saving external data.
EXTERNAL_SIZE_THRESHOLD = 1024

def normalize_domain(domain: str) -> str:
    """The default ONNX domain is written as "" in models; reports call it "ai.onnx"."""
    return domain or DEFAULT_DOMAIN


def text_of(value: str | bytes) -> str:
    """A string field of a model as text. protobuf hands a string that is not valid UTF-8 back
    as bytes (a damaged file, a producer that wrote Latin-1), and refuses those bytes when they
    are assigned to another message: undecodable bytes become U+FFFD."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def tensor_elements(tensor: TensorProto) -> int:
    return math.prod(tensor.dims)


def external_entries(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's data, computed from its metadata; reads no weight bytes."""
    if is_external(tensor):
        length = external_entries(tensor).get("length")
        if length is not None and length.isascii() and length.isdigit():
            return int(length)
    if tensor.data_type == TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    bits = element_bits(tensor.data_type)
    if bits:
        # From dims and type, not len(raw_data): reading the field copies every byte (0.25 s for 400 MB).
        return (tensor_elements(tensor) * bits + 7) // 8
    return len(tensor.raw_data) if tensor.HasField("raw_data") else 0


def approx_serialized_bytes(proto: ModelProto) -> int:
    """About the size of ``proto`` serialized: its inline tensors' bytes from their metadata, plus
    a margin per node, over every graph. Reads no weight bytes (``ByteSize()`` walks them all)."""
    nodes = sum(len(graph.node) for _, graph in iter_graphs(proto.graph))
    return 512 * nodes + sum(tensor_nbytes(t.tensor) for t in iter_tensors(proto.graph) if not is_external(t.tensor))


# --------------------------------------------------------------------------- graph walking


def subgraphs_of(node: NodeProto) -> Iterator[tuple[str, GraphProto]]:
    """(attribute name, graph) for every graph attribute of a node (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for index, graph in enumerate(attr.graphs):
                yield f"{attr.name}[{index}]", graph


def _require_text(proto: ModelProto, path: Path) -> None:
    """ONNX text fields are UTF-8; protobuf hands back bytes where they are not (a corrupt or
    hand-edited file). Refuse such a model with the field that is wrong, before anything trips on it."""
    def bad(value) -> bool:
        return isinstance(value, bytes)

    for entry in proto.opset_import:
        if bad(entry.domain):
            raise ModelReadError(
                f"{path}: opset import domain {entry.domain!r} is not valid UTF-8; the file is corrupt",
                hint="re-export the model",
            )
    for scope, graph in iter_graphs(proto.graph):
        for index, node in enumerate(graph.node):
            if bytes not in map(type, (node.op_type, node.domain, node.name, *node.input, *node.output)):
                continue  # all text (one C-level pass per node; which field is wrong is found below)
            for field_name in ("op_type", "domain", "name"):
                if bad(getattr(node, field_name)):
                    raise ModelReadError(
                        f"{path}: node {index}{' in ' + scope if scope else ''} has {field_name} that is not valid "
                        f"UTF-8 ({getattr(node, field_name)!r}); the file is corrupt", hint="re-export the model")
            if any(bad(name) for name in list(node.input) + list(node.output)):
                raise ModelReadError(
                    f"{path}: node {index} names a tensor that is not valid UTF-8; the file is corrupt",
                    hint="re-export the model",
                )
        for value in list(graph.input) + list(graph.output) + list(graph.value_info) + list(graph.initializer):
            if bad(value.name):
                raise ModelReadError(f"{path}: a tensor name is not valid UTF-8 ({value.name!r}); the file is corrupt",
                                     hint="re-export the model")


def iter_graphs(graph: GraphProto, scope: str = "") -> Iterator[tuple[str, GraphProto]]:
    """The graph and all its subgraphs, depth first, each with a scope path ("" for the main graph)."""
    yield scope, graph
    for node in graph.node:
        if not node.attribute:
            continue  # most nodes have none: no generator for them (a graph of 100,000 nodes is walked often)
        for attr_name, subgraph in subgraphs_of(node):
            label = f"{scope}/{node.name or node.op_type}.{attr_name}"
            yield from iter_graphs(subgraph, label)


def iter_nodes(graph: GraphProto) -> Iterator[tuple[str, NodeProto]]:
    """Every node of the graph and its subgraphs, with the scope of the graph holding it."""
    for scope, sub in iter_graphs(graph):
        for node in sub.node:
            yield scope, node


class StoredTensor(NamedTuple):
    owner: str  # the initializer's name, or "node.attribute" for tensors held by nodes
    tensor: TensorProto
    is_initializer: bool  # False for tensors in node attributes (Constant values and the like)


def iter_tensors(graph: GraphProto) -> Iterator[StoredTensor]:
    """Every stored tensor (initializers, sparse initializers, tensor attributes), in all subgraphs."""
    for _, sub in iter_graphs(graph):
        for tensor in sub.initializer:
            yield StoredTensor(tensor.name, tensor, True)
        for sparse in sub.sparse_initializer:
            yield StoredTensor(sparse.values.name, sparse.values, True)
            yield StoredTensor(sparse.indices.name or f"{sparse.values.name}.indices", sparse.indices, True)
        for node in sub.node:
            for attr in node.attribute:
                owner = f"{node.name or node.op_type}.{attr.name}"
                if attr.type == AttributeProto.TENSOR:
                    yield StoredTensor(owner, attr.t, False)
                elif attr.type == AttributeProto.TENSORS:
                    for tensor in attr.tensors:
                        yield StoredTensor(owner, tensor, False)
                elif attr.type == AttributeProto.SPARSE_TENSOR:
                    yield StoredTensor(owner, attr.sparse_tensor.values, False)
                    yield StoredTensor(owner, attr.sparse_tensor.indices, False)
                elif attr.type == AttributeProto.SPARSE_TENSORS:
                    for sparse in attr.sparse_tensors:
                        yield StoredTensor(owner, sparse.values, False)
                        yield StoredTensor(owner, sparse.indices, False)


# --------------------------------------------------------------------------- external data


@dataclass
class ExternalDataFile:
    """One external-data file referenced by a model."""

    location: str
    path: Path
    size: int
    tensors: int = 0
    bytes_referenced: int = 0


def _resolve_external(folder: Path, owner: str, tensor: TensorProto,
                      resolved: dict[str, Path] | None = None) -> tuple[str, Path, int, int]:
    """Validate one external tensor's location; return (location, resolved path, offset, length).
    ``resolved``: locations already checked (a model's tensors share a few files: each is
    resolved once, not once per tensor)."""
    entries = external_entries(tensor)
    location = entries.get("location", "")
    if not location:
        raise ModelReadError(
            f"tensor '{owner}' is marked as external data but has no location",
            hint="re-export the model or re-save it with onnx.save_model(..., save_as_external_data=True)",
        )
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise UnsafeExternalDataError(
            f"external data of tensor '{owner}' uses an absolute path ('{location}'), which ortprep refuses",
            hint="move the data file next to the model and re-save it with a relative location",
        )
    target = resolved.get(location) if resolved is not None else None
    if target is None:
        folder_real = Path(os.path.realpath(folder))
        target = Path(os.path.realpath(folder / location))
        if target != folder_real and folder_real not in target.parents:
            raise UnsafeExternalDataError(
                f"external data of tensor '{owner}' points outside the model's folder ('{location}' -> {target})",
                hint="move the data file next to the model and re-save it with a relative location",
            )
        if not target.is_file():
            raise ModelReadError(
                f"external data file '{location}' of tensor '{owner}' is missing (expected at {folder / location})",
                hint="copy the data file next to the model",
            )
        if resolved is not None:
            resolved[location] = target
    offset_text = entries.get("offset", "0") or "0"
    offset = int(offset_text) if offset_text.isascii() and offset_text.isdigit() else 0
    length = tensor_nbytes(tensor)
    return location, target, offset, length


def require_sound_tensors(proto: ModelProto, path: Path) -> None:
    """Refuse a model whose stored tensors (initializers, sparse initializers and tensor
    attributes such as Constant values, in every subgraph) hold data that does not fit their shape
    and type: one line naming the tensor, before any step decodes it (ModelReadError, exit 2)."""
    for owner, tensor, is_initializer in iter_tensors(proto.graph):
        defect = tensor_defect(tensor)
        if defect:
            what = f"initializer '{owner}'" if is_initializer else f"tensor attribute '{owner}'"
            raise ModelReadError(f"{path}: {what} is malformed: {defect}",
                                 hint="the file is corrupt or was written by a faulty exporter; re-export the model")


def scan_external_data(proto: ModelProto, folder: Path) -> list[ExternalDataFile]:
    """Check every external-data reference of a model, without reading the data.

    Raises UnsafeExternalDataError for locations leaving ``folder`` and ModelReadError for
    missing or too-short data files.
    """
    files: dict[Path, ExternalDataFile] = {}
    resolved: dict[str, Path] = {}
    for owner, tensor, _ in iter_tensors(proto.graph):
        if not is_external(tensor):
            continue
        location, target, offset, length = _resolve_external(folder, owner, tensor, resolved)
        entry = files.get(target)
        if entry is None:
            entry = files[target] = ExternalDataFile(location=location, path=target, size=target.stat().st_size)
        if offset + length > entry.size:
            raise ModelReadError(
                f"external data file '{location}' is too short for tensor '{owner}' "
                f"(needs bytes {offset}..{offset + length}, file has {entry.size})",
                hint="the data file is truncated or belongs to another model; copy the complete file",
            )
        entry.tensors += 1
        entry.bytes_referenced += length
    return list(files.values())


# --------------------------------------------------------------------------- reading


def _looks_like_text(head: bytes) -> bool:
    if not head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    printable = set(string.printable)
    return sum(ch in printable for ch in text) / len(text) > 0.95


def _read_model_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ModelReadError(f"model file not found: {path}", hint="check the path")
    if path.is_dir():
        candidates = sorted(p.name for p in path.glob("*.onnx"))[:3]
        hint = (
            f"pass a file inside it, e.g. {path / candidates[0]}"
            if candidates
            else "pass the .onnx file, not its folder"
        )
        raise ModelReadError(f"{path} is a directory, not an ONNX model file", hint=hint)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelReadError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from exc
    if not data:
        raise ModelReadError(f"{path} is empty (0 bytes)", hint="re-export or re-download the model")
    return data


def parse_model(data: bytes, path: Path) -> ModelProto:
    """Parse ONNX protobuf bytes; raise ModelReadError with a clear reason when they are not a model."""
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        if _looks_like_text(data[:4096]):
            raise ModelReadError(
                f"{path} is a text file, not an ONNX model (ONNX models are binary protobuf)",
                hint="pass the exported .onnx file",
            ) from exc
        raise ModelReadError(
            f"{path} is not a readable ONNX model: protobuf parsing failed ({str(exc).strip() or type(exc).__name__})",
            hint="the file is truncated or not ONNX; re-export or re-download it",
        ) from exc
    if not proto.HasField("graph") or proto.ir_version <= 0:
        what = "a text file" if _looks_like_text(data[:4096]) else "not an ONNX model"
        raise ModelReadError(
            f"{path} is {what}: it parses as protobuf but has no ONNX graph or IR version",
            hint="pass the exported .onnx file; if it was cut short, re-download it",
        )
    return proto


# --------------------------------------------------------------------------- writing


def failed_path(dest: Path) -> Path:
    """Where --keep-failed writes a result that was refused: beside ``dest``, never at it, so a
    refusal leaves nothing at the path the user (or the next step) reads: m.fp16.onnx -> m.fp16.failed.onnx."""
    dest = Path(dest)
    stem = dest.name[:-len(".onnx")] if dest.name.endswith(".onnx") else dest.name
    return dest.with_name(f"{stem}.failed.onnx")


def check_output_path(dest: Path, *, input_path: Path | None = None, force: bool = False) -> Path:
    """Validate an output path before any work is done; return it absolute.

    Refuses a missing parent folder, a directory, and the input model itself (unless ``force``).
    """
    dest = Path(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise OutputPathError(
            f"output folder {parent} does not exist",
            hint="create it first or choose another output path",
        )
    if dest.is_dir():
        raise OutputPathError(f"output path {dest} is a directory", hint="give a file name, e.g. model.out.onnx")
    if (
        input_path is not None
        and dest.exists()
        and os.path.realpath(dest) == os.path.realpath(input_path)
        and not force
    ):
        raise OutputPathError(
            f"output path {dest} is the input model",
            hint="choose another output path, or pass --force to overwrite the input",
        )
    return Path(os.path.abspath(dest))


def _default_file_mode() -> int:
    # Temp files are created 0600; give the final file the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    """Write bytes to ``dest`` through a temp file in the same folder and a rename."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".ortprep-tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _default_file_mode())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- the handle


@dataclass
class ModelHandle:
    """An ONNX model and where it came from.

    ``weights_loaded`` is False after a graph-only open: external tensors are then still
    references into ``folder``, and nothing has read their bytes.
    """

    proto: ModelProto
    path: Path | None = None
    weights_loaded: bool = True
    external_files: list[ExternalDataFile] = field(default_factory=list)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, load_weights: bool = False) -> "ModelHandle":
        """Open a model file. External data is validated (inside the folder, present, long enough)
        but only read when ``load_weights`` is True."""
        path = Path(os.path.abspath(path))
        proto = parse_model(_read_model_bytes(path), path)
        _require_text(proto, path)
        require_sound_tensors(proto, path)
        external = scan_external_data(proto, path.parent)
        handle = cls(proto=proto, path=path, weights_loaded=not external, external_files=external)
        if load_weights:
            handle.load_weights()
        return handle

    @property
    def folder(self) -> Path | None:
        return self.path.parent if self.path else None

    @property
    def graph(self) -> GraphProto:
        return self.proto.graph

    def opsets(self) -> dict[str, int]:
        """Opset imported per domain, with the default domain named "ai.onnx"."""
        return {normalize_domain(op.domain): op.version for op in self.proto.opset_import}

    def has_external_data(self) -> bool:
        return bool(self.external_files) or any(is_external(t.tensor) for t in iter_tensors(self.graph))

    def load_weights(self) -> None:
        """Read external tensors into the proto (already validated at open)."""
        if self.weights_loaded:
            return
        assert self.folder is not None
        onnx.external_data_helper.load_external_data_for_model(self.proto, str(self.folder))
        self.weights_loaded = True

    def sha256(self, *, include_data: bool = False) -> dict[str, str]:
        """sha256 of the model file, and of each external-data file when ``include_data``."""
        if self.path is None:
            return {"<memory>": hashlib.sha256(self.proto.SerializeToString()).hexdigest()}
        digests = {self.path.name: file_sha256(self.path)}
        if include_data:
            for entry in self.external_files:
                digests[entry.location] = file_sha256(entry.path)
        return digests

    def estimated_size(self) -> int:
        """Bytes the model would take serialized with every tensor inline (reads no weights).

        From the tensors' metadata and a margin per node while that is clearly below the size at
        which the model must go to external data; exact (``ByteSize()``, which walks every weight
        byte: 73 ms on a 40 MB chain, 1.3 s on 400 MB) only near it, where the choice depends on it."""
        weights = sum(tensor_nbytes(t.tensor) for t in iter_tensors(self.graph) if is_external(t.tensor))
        estimate = approx_serialized_bytes(self.proto) + weights
        if estimate < AUTO_EXTERNAL_THRESHOLD * 3 // 4:
            return estimate
        try:
            return self.proto.ByteSize() + weights
        except (ValueError, RuntimeError):  # protobuf refuses sizes it cannot represent
            return PROTO_LIMIT_BYTES + weights

    def save(
        self,
        dest: str | os.PathLike[str],
        *,
        force: bool = False,
        external_data: bool | None = None,
    ) -> Path:
        """Write the model to ``dest`` atomically; return the absolute path written.

        ``external_data=None`` keeps the input's layout, and switches to external data by
        itself when the model would pass protobuf's 2 GB limit. External data is written
        to ``<dest name>.data`` beside the model, renamed into place before the model.
        """
        dest = check_output_path(Path(dest), input_path=self.path, force=force)
        if external_data is None:
            external_data = self.has_external_data() or self.estimated_size() > AUTO_EXTERNAL_THRESHOLD
        self.load_weights()
        proto = ModelProto()
        proto.CopyFrom(self.proto)
        data_name = f"{dest.name}.data"
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".ortprep-tmp", dir=dest.parent))
        try:
            tmp_model = tmp_dir / dest.name
            if external_data:
                # the tensors are marked here, not by save_model(save_as_external_data=True): onnx
                # (1.23) refuses a location that exists relative to the working directory, so a
                # --force rerun from the output's folder failed on the previous run's .data file
                for _, sub in iter_graphs(proto.graph):
                    for tensor in sub.initializer:
                        # sys.getsizeof, as onnx's own conversion measures (the bytes and the object's header)
                        if tensor.HasField("raw_data") and sys.getsizeof(tensor.raw_data) >= EXTERNAL_SIZE_THRESHOLD:
                            onnx.external_data_helper.set_external_data(tensor, data_name)
                onnx.save_model(proto, str(tmp_model))
            else:
                onnx.save_model(proto, str(tmp_model))
            tmp_data = tmp_dir / data_name
            mode = _default_file_mode()
            if tmp_data.exists():
                os.chmod(tmp_data, mode)
                os.replace(tmp_data, dest.parent / data_name)
            os.chmod(tmp_model, mode)
            os.replace(tmp_model, dest)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        log.debug("saved %s (external data: %s)", dest, external_data)
        return dest


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
