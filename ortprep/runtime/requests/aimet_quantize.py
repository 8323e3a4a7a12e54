"""AimetQuantize: AIMET-ONNX's post-training quantization in a worker of the AIMET interpreter.

Runs under ``.venv-aimet``'s Python (torch and aimet_onnx live there, never in ortprep's own
environment), so this module imports the standard library and ortprep's runtime protocol only;
onnx, numpy and aimet_onnx are imported by the handler. The input file is read into memory and
every pass (batch-norm folding, cross-layer equalization) changes that copy, never the file.
What the AIMET calls do, and why exclusions are spelled as they are here:
docs/decisions/engines-nncf-aimet.md; figures on a shipped model: docs/decisions/aimet-engine.md.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests.failure import record_failure

# ortprep's quant types -> AIMET's (signedness is the export's business: force_activation_as)
BITS = {"int8": "int8", "uint8": "int8", "int16": "int16", "uint16": "int16"}
# what AdaRound can optimize (aimet_onnx.adaround.utils.AdaroundSupportedModules)
ADAROUND_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# a protobuf is capped at 2 GiB: above this, the weights go to an external data file
EXTERNAL_DATA_BYTES = 1_800_000_000


@dataclass
class AimetQuantizeReply(Reply):
    """``engine_seconds``: AIMET's own work, loading and writing included; ``import_seconds``:
    importing aimet_onnx and torch (a worker's first request only); ``peak_rss``: the worker's peak
    resident bytes; ``applied``: what ran, for the report."""

    engine_seconds: float = 0.0
    import_seconds: float = 0.0
    version: str | None = None
    peak_rss: int | None = None
    error_type: str | None = None
    traceback: str | None = None
    applied: dict[str, Any] = field(default_factory=dict)


@dataclass
class AimetQuantize(Request):
    """Quantize ``model`` into ``output`` (a QDQ model ORT loads) with AIMET-ONNX.

    ``settings``: activation_type and weight_type (int8, uint8, int16, uint16: the width goes to
    AIMET, the signedness to the export), per_channel, config (an AIMET alias: "htp_v73",
    "default"), quant_scheme ("min_max", "tf_enhanced"), extra_options' ActivationSymmetric, cle,
    seq_mse (with seq_mse_samples, 0 for all, and seq_mse_candidates), adaround_iterations (0: off),
    external_data. ``exclude_nodes``/``exclude_ops`` stay float; ``wide_tensors`` get 16 bits."""

    reply_type = AimetQuantizeReply

    workdir: str
    model: str
    output: str
    calibration: Any  # a CalibrationSet's JSON
    indices: list[int]
    settings: dict[str, Any] = field(default_factory=dict)
    exclude_nodes: list[str] = field(default_factory=list)
    exclude_ops: list[str] = field(default_factory=list)
    wide_tensors: list[str] = field(default_factory=list)
    progress: str | None = None  # a file the parent polls: "done total" over the passes

    def affinity(self):
        # torch's and AIMET's state (custom-op libraries, thread pools) stays with AIMET's requests
        return "aimet"

    def handle(self, state: WorkerState) -> AimetQuantizeReply:

        reply = AimetQuantizeReply(status="failed", stage="aimet")
        state.sessions.clear()
        previous = os.getcwd()
        started = time.perf_counter()
        try:
            import aimet_onnx  # torch with it: seconds, once per worker

            reply.version = str(getattr(aimet_onnx, "__version__", "?"))
            reply.import_seconds = time.perf_counter() - started
            started = time.perf_counter()
            self.model, self.output, self.workdir = (os.path.abspath(p) for p in (self.model, self.output,
                                                                                  self.workdir))
            os.makedirs(self.workdir, exist_ok=True)
            os.chdir(self.workdir)  # whatever AIMET writes beside its sim lands here
            reply.applied = self._quantize()
            reply.status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            record_failure(reply, exc, message_chars=500, traceback_chars=3000)
        finally:
            os.chdir(previous)
            reply.engine_seconds = time.perf_counter() - started
            reply.peak_rss = _peak_rss()
        return reply

    # --- the passes ------------------------------------------------------------------------------

    def _quantize(self) -> dict[str, Any]:
        import onnx
        from aimet_onnx import QuantizationSimModel, apply_adaround, apply_seq_mse
        from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
        from aimet_onnx.cross_layer_equalization import equalize_model

        s = self.settings
        cle, seq_mse = bool(s.get("cle", True)), bool(s.get("seq_mse", False))
        adaround = int(s.get("adaround_iterations") or 0)
        passes = 3 + cle + seq_mse + bool(adaround)  # load, calibrate, export + the algorithms
        done, seconds, mark = 0, {}, [time.perf_counter()]

        def step(name: str, counted: bool = True) -> None:
            nonlocal done
            if counted:
                done += 1
                _write_progress(self.progress, done, passes)
            now = time.perf_counter()
            seconds[name] = round(seconds.get(name, 0.0) + now - mark[0], 3)
            mark[0] = now

        model = onnx.load(self.model)  # a copy in memory: the passes below change it, never the file
        _explicit_groups(model)
        step("load")
        if cle:
            equalize_model(model)  # folds batch norms first, then scales and folds high biases
            step("cle")
        else:
            fold_all_batch_norms_to_weight(model)  # the sim simulates folded batch norms only
        samples = _Samples(self.calibration, self.indices)
        activation = s.get("activation_type", "uint8")
        sim = QuantizationSimModel(
            model,
            param_type=BITS[s.get("weight_type", "int8")],
            activation_type=BITS[activation],
            quant_scheme=s.get("quant_scheme", "min_max"),
            config_file=_config_file(s.get("config") or "default", bool(s.get("per_channel", True)),
                                     bool((s.get("extra_options") or {}).get("ActivationSymmetric")), self.workdir),
            path=os.path.join(self.workdir, "sim"),
        )
        step("sim", counted=False)
        excluded, missing = _keep_float(sim, self.exclude_nodes, self.exclude_ops)
        deferred = _input_readers(sim, excluded) if seq_mse else {}
        wide = [name for name in self.wide_tensors if name]
        if wide:
            sim.set_tensor_precision(wide, "int16", strict=False)
        if seq_mse:
            # a kept node that reads a graph input stays in SeqMSE (its weight quantizer still on, turned
            # off below): AIMET 2.42 leaves the inputs of the quantized node after it empty otherwise
            apply_seq_mse(sim, samples.first(int(s.get("seq_mse_samples") or 0)),
                          num_candidates=int(s.get("seq_mse_candidates") or 20),
                          nodes_to_exclude=sorted(excluded - set(deferred)) or None)
            step("seq_mse")
        if adaround:
            include = [op.name for op in sim.connected_graph.get_all_ops().values()
                       if op.type in ADAROUND_OPS and op.name not in excluded]
            apply_adaround(sim, samples, num_iterations=adaround, nodes_to_include=include)
            step("adaround")
        for quantizer in (q for quantizers in deferred.values() for q in quantizers):
            quantizer.enabled = False
        sim.compute_encodings(samples)
        step("calibrate")
        signed = activation in ("int8", "int16")
        qdq = sim.to_onnx_qdq(prequantize_constants=True, force_activation_as="signed" if signed else "unsigned")
        _save(qdq, self.output, bool(s.get("external_data")))
        step("export")
        return {"cle": cle, "seq_mse": seq_mse, "adaround_iterations": adaround, "config": s.get("config") or "default",
                "per_channel": bool(s.get("per_channel", True)), "kept_float": sorted(excluded),
                "not_found": sorted(missing), "wide_tensors": wide, "samples": len(samples), "pass_seconds": seconds,
                "opset": next((o.version for o in qdq.opset_import if o.domain in ("", "ai.onnx")), None)}


def _explicit_groups(model) -> None:
    """Write ONNX's default ``group=1`` on every Conv that omits it: AIMET 2.42's cross-layer
    equalization reads a missing attribute as an unsupported layer and skips the pair (measured:
    docs/decisions/aimet-engine.md). The value is the default, so nothing computes otherwise."""
    import onnx

    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose") and not any(a.name == "group" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("group", 1))


class _Samples:
    """The calibration samples as AIMET's passes take them: a sized collection, read one sample at
    a time on every pass over it (SeqMSE and AdaRound iterate more than once)."""

    def __init__(self, calibration: Any, indices: list[int]) -> None:
        from ortprep.runtime.calibration import CalibrationSet

        self.calibration = CalibrationSet.from_json(calibration)
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def first(self, count: int) -> _Samples:
        """The first ``count`` samples (0: all of them)."""
        if not count or count >= len(self.indices):
            return self
        subset = _Samples.__new__(_Samples)
        subset.calibration, subset.indices = self.calibration, self.indices[:count]
        return subset

    def __iter__(self):
        return (self.calibration.sample(index) for index in self.indices)

    def __contains__(self, item) -> bool:  # Collection's protocol; never asked in practice
        return any(item is sample for sample in self)


def _config_file(alias: str, per_channel: bool, symmetric_activations: bool, workdir: str) -> str:
    """AIMET's configuration for ``alias``, rewritten into ``workdir`` where ortprep's settings
    differ from it: per-tensor weights (the aliases make Conv/Gemm/MatMul per-channel), symmetric
    activations (CUDA's and TensorRT's presets)."""
    from aimet_onnx.common.quantsim_config.quantsim_config import _get_config_file

    if per_channel and not symmetric_activations:
        return alias
    with open(_get_config_file(alias), encoding="utf-8") as source:
        config = json.load(source)
    defaults = config.setdefault("defaults", {})
    if not per_channel:
        defaults["per_channel_quantization"] = "False"
        for entry in (config.get("op_type") or {}).values():
            entry.pop("per_channel_quantization", None)
    if symmetric_activations:
        defaults.setdefault("ops", {})["is_symmetric"] = "True"
    path = os.path.join(workdir, f"aimet_config_{alias}.json")
    with open(path, "w", encoding="utf-8") as out:
        json.dump(config, out)
    return path


def _keep_float(sim, names: list[str], op_types: list[str]) -> tuple[set[str], set[str]]:
    """Disable the quantizers of the nodes kept float (AIMET has no ignored scope): each one's
    weights, and each activation quantizer that only kept-float nodes read, through the data
    movement ops (Flatten, Reshape) that pass its grid on; a kept node's output that a quantized
    node reads keeps its Q/DQ. Returns (kept float, names not in the graph: a node the preparation
    renamed or folded, as a batch norm into its conv)."""
    ops = sim.connected_graph.get_all_ops()
    wanted = set(names) | {op.name for op in ops.values() if op.type in set(op_types)}
    excluded = {name for name in wanted if name in ops}
    if not excluded:
        return excluded, wanted
    for name in excluded - set(_input_readers(sim, excluded)):
        for quantizer in sim.get_op_quantizers(ops[name])[2].values():
            quantizer.enabled = False
    products = [p for p in sim.connected_graph.get_all_products().values() if not p.is_parm]
    effective = {}
    for product in products:
        try:
            effective[product.name] = sim._get_enabled_quantizer_name(product.name)  # noqa: SLF001
        except KeyError:
            effective[product.name] = None
    needed, touched = set(), set()
    for product in products:
        quantizer = effective[product.name]
        if quantizer is None:
            continue
        producer = product.producer.name if product.producer is not None else None
        if producer in excluded:
            touched.add(quantizer)
        elif not product.consumers and producer is not None:
            needed.add(quantizer)  # a graph output of a quantized node
        for reader in product.consumers:
            if reader.name in excluded:
                touched.add(quantizer)
            elif not all(effective.get(out.name) == quantizer for out in reader.outputs):
                needed.add(quantizer)  # a node that computes on the quantized tensor
    for quantizer in touched - needed:
        sim.qc_quantize_op_dict[quantizer].enabled = False
    return excluded, wanted - excluded


def _input_readers(sim, excluded: set[str]) -> dict[str, list]:
    """The kept-float nodes that read a graph input, each with its weight quantizers."""
    ops = sim.connected_graph.get_all_ops()
    inputs = {i.name for i in sim.model.model.graph.input}
    return {name: list(sim.get_op_quantizers(ops[name])[2].values()) for name in sorted(excluded)
            if any(p.name in inputs for p in ops[name].inputs)}


def _save(model, output: str, external: bool) -> None:
    """Write ``model`` to ``output`` atomically, its weights in ``<output>.data`` when asked or when
    the protobuf would pass 2 GiB."""
    import onnx

    external = external or model.ByteSize() > EXTERNAL_DATA_BYTES
    folder, name = os.path.split(os.path.abspath(output))
    partial = os.path.join(folder, f".{name}.partial")
    if external:
        location = f"{name}.data"
        onnx.save_model(model, partial, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=location, size_threshold=1024)
    else:
        onnx.save_model(model, partial)
    os.replace(partial, output)


def _write_progress(path: str | None, done: int, total: int) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(f"{done} {total}")


def _peak_rss() -> int | None:
    """The worker's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return None
