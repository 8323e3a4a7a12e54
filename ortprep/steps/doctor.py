"""doctor: what this machine's ONNX Runtime setup can do, and what will go wrong with it.

Also `doctor --scan PATH`: reads Python and requirements files (parsing, never running them) for
known ONNX Runtime pitfalls."""

from __future__ import annotations

import ast
import ctypes
import importlib.metadata
import logging
import platform
import re
import sys
from pathlib import Path
from typing import Any

import onnx

from ortprep.version import __version__
from ortprep.eps.registry import gpu_libraries
from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.report import StepResult
from ortprep.runtime.providers import (
    import_ort,
    installed_ort_distributions,
    ort_cuda_major,
    ort_max_opset,
)
from ortprep.steps.base import Step, StepContext
from ortprep.options import DoctorOptions

log = logging.getLogger(__name__)

SCHEMA = "ortprep.doctor/1"

CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def _pip_nvidia_dirs() -> list[Path]:
    """Library folders of NVIDIA's pip packages (nvidia-cudnn-cu12 and friends)."""
    folders = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            folders.extend(p for p in base.glob("*/lib") if p.is_dir())
            folders.extend(p for p in base.glob("*/bin") if p.is_dir())
    return folders


def probe_library(file_name: str) -> tuple[bool, str]:
    """Try to load a shared library the way the EP would; (loaded, where or why not)."""
    try:
        ctypes.CDLL(file_name)
        return True, "found on the library path"
    except OSError as exc:
        error = str(exc)
    for folder in _pip_nvidia_dirs():
        candidate = folder / file_name
        if candidate.exists():
            try:
                ctypes.CDLL(str(candidate))
                return True, f"{candidate} (pip package; ORT loads it with onnxruntime.preload_dlls())"
            except OSError as exc:
                error = str(exc)
    return False, error.split(":")[-1].strip()[:200] or "not found"


def cpu_features() -> list[str]:
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    return [feature for feature in CPU_FEATURES if feature in flags]


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requires_ort(distribution: str) -> str | None:
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((r.split(";")[0].strip() for r in requirements if re.match(r"onnxruntime\b(?![-_])", r)), None)


def execution_providers(runtimes: dict[str, Path] | None = None) -> list[dict[str, Any]]:
    """Every EP ortprep knows, and whether (and through what) this machine can run it: built into
    the installed ORT, a plugin package with a device for it, or another environment (--runtime)."""
    from ortprep.eps.registry import EPS
    from ortprep.runtime.providers import plugin_table, probe_runtime

    runtimes = runtimes or {}
    local = probe_runtime()
    plugins = {entry["provider"]: entry for entry in plugin_table()}
    rows = []
    for spec in EPS:
        python = runtimes.get(spec.name)
        probe = probe_runtime(str(python)) if python else local
        row: dict[str, Any] = {"ep": spec.name, "provider": spec.provider, "runtime": str(python) if python else None,
                               "available": probe.ok and probe.runs(spec.name), "via": None, "package": None,
                               "devices": [], "requires": None, "why_not": None}
        entry = plugins.get(spec.provider)
        found = probe.plugin_for(spec.provider) or next((p for p in probe.plugins if p["provider"] == spec.provider
                                                          and p.get("installed")), None)
        if probe.ok and spec.provider in probe.providers:
            row.update(via="built in", package=f"onnxruntime {probe.version}")
        elif found is not None and entry is not None:
            row.update(via="plugin", package=f"{entry['distribution']} {found.get('version') or ''}".strip(),
                       devices=probe.devices_for(spec.name) if spec.name in entry["eps"] else [],
                       requires=_requires_ort(entry["distribution"]) if python is None else None)
            if not row["devices"]:
                offered = [d.get("ep_metadata") for d in found.get("devices", [])]
                row["why_not"] = (found.get("error") or f"{entry['distribution']} is installed but offers no device "
                                  f"for {spec.name} here (devices offered: {offered or 'none'})")
        elif not probe.ok:
            row["why_not"] = probe.error
        else:
            row["why_not"] = "not installed"
            row["install"] = spec.install_hint
        rows.append(row)
    return rows


def doctor(runtimes: dict[str, Path] | None = None, ort_version: str | None = None) -> StepResult:
    """This machine's ORT setup: packages, EPs (built in, plugin, other environments), GPU
    libraries, CPU int8 features, known clashes."""
    report = StepResult(step="doctor", schema=SCHEMA)
    ort = import_ort()
    distributions = installed_ort_distributions()
    providers = [p for p in ort.get_available_providers()] if ort else []
    data: dict[str, Any] = {
        "ortprep": __version__,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "onnx": {"version": onnx.__version__, "max_opset": onnx.defs.onnx_opset_version()},
        "onnxruntime": {
            "version": getattr(ort, "__version__", None) if ort else None,
            "max_opset": ort_max_opset(),
            "distributions": [{"name": d.name, "version": d.version} for d in distributions],
            "providers": providers,
        },
    }
    if ort is None:
        report.add(Finding.of("DOC005", "ONNX Runtime is not importable",
                              fix="pip install 'ortprep[cpu]' (or [gpu], [directml], [openvino])"))
    if len(distributions) > 1:
        names = ", ".join(f"{d.name} {d.version}" for d in distributions)
        report.add(Finding.of(
            "DOC001",
            f"several ONNX Runtime packages are installed ({names}); they share the 'onnxruntime' module and "
            "overwrite each other's files, so which EPs work depends on install order",
            fix="pip uninstall -y " + " ".join(d.name for d in distributions) + " and install exactly one",
        ))
    system = "windows" if platform.system() == "Windows" else "linux"
    libraries = []
    gpu_wanted = any(p in providers for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider"))
    for key, file_name, label in gpu_libraries(system, ort_cuda_major()):
        loaded, detail = probe_library(file_name)
        libraries.append({"name": key, "file": file_name, "label": label, "loaded": loaded, "detail": detail})
        if gpu_wanted and not loaded and (key != "nvinfer" or "TensorrtExecutionProvider" in providers):
            ep = "TensorRT" if key == "nvinfer" else "CUDA"
            report.add(Finding.of(
                "DOC002",
                f"{label} ({file_name}) does not load: the {ep} EP is listed as available but sessions will fail "
                "or silently run on the CPU",
                fix=_gpu_library_fix(key, file_name, ort_cuda_major()),
            ))
    data["libraries"] = libraries
    features = cpu_features()
    data["cpu"] = {"features": features}
    if platform.machine() in ("x86_64", "AMD64") and not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(features):
        report.add(Finding.of(
            "DOC003",
            "this CPU has no VNNI/AMX int8 instructions: quantized (int8) models may run no faster, or slower, "
            "than float32 here, and ORT's uint8 x int8 kernels can saturate and change results (ortprep quantize "
            "--ep cpu uses 7-bit weights here for that)",
            fix="measure with ortprep load; deploy int8 on CPUs with VNNI or on an NPU/GPU EP",
        ))
    clash = [name for name in ("pycuda", "tensorrt", "cupy") if _installed(name)]
    if clash and (gpu_wanted or any(d.flavour.startswith("gpu") for d in distributions)):
        report.add(Finding.of(
            "DOC004",
            f"{', '.join(clash)} installed next to ONNX Runtime's CUDA/TensorRT EPs: two owners of the CUDA context "
            "in one process (pycuda.autoinit, a TensorRT runtime); TensorRT work made in one context fails with "
            "'invalid resource handle' when another is current (ORT's CUDA EP itself ran with a foreign context "
            "current, created or destroyed around it: measured, onnxruntime-gpu 1.31.1 on an H100)",
            fix="create and push the CUDA context explicitly and share it, or keep them in separate processes; "
            "ortprep doctor --scan PATH finds the code that does this",
        ))
    data["eps"] = execution_providers(runtimes)
    from ortprep.runtime.providers import ort_max_ir

    data["onnxruntime"]["max_ir_version"] = ort_max_ir()
    if ort_version is not None:
        from ortprep.eps.ort_releases import release_limits

        limits = release_limits(ort_version)
        data["target_runtime"] = {"version": ort_version, **limits}
    data["known_bad_combinations"] = [
        "DmlExecutionProvider with any non-CPU EP in one session (\"DML EP can only be used with CPU EPs\")",
        "OpenVINOExecutionProvider with DmlExecutionProvider in one session (\"doesn't support memcpy\")",
    ]
    report.data = data
    return report


# --------------------------------------------------------------------------- scan

FLAVOURS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn",
            "onnxruntime-training", "ort-nightly", "ort-nightly-gpu")
NON_CPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "OpenVINOExecutionProvider",
                     "QNNExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider",
                     "CoreMLExecutionProvider", "NnapiExecutionProvider")
SKIP_DIRS = {".venv", "venv", ".git", "site-packages", "node_modules", "__pycache__", ".tox", "build", "dist"}


def _files(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    if root.is_file():
        return [root]
    found = []
    for path in sorted(root.rglob("*")):
        if any(part in SKIP_DIRS or part.startswith(".") for part in path.relative_to(root).parts[:-1]):
            continue
        if path.is_file() and any(path.match(p) for p in patterns):
            found.append(path)
    return found


def _strings(node: ast.AST) -> list[str]:
    """String constants in a list/tuple literal, including (name, options) tuples."""
    result = []
    if isinstance(node, (ast.List, ast.Tuple)):
        for element in node.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                result.append(element.value)
            elif isinstance(element, ast.Tuple) and element.elts and isinstance(element.elts[0], ast.Constant):
                result.append(str(element.elts[0].value))
    return result


def _scan_python(path: Path, shown: str) -> list[Finding]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except SyntaxError as exc:
        log.info("cannot parse %s: %s", path, exc)
        return []
    findings: list[Finding] = []
    list_values: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                list_values[node.targets[0].id] = node.value
    text_providers = {node.value for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    uses_gpu_ep = bool({"CUDAExecutionProvider", "TensorrtExecutionProvider"} & text_providers)
    for node in ast.walk(tree):
        autoinit = (isinstance(node, ast.Import) and any(a.name == "pycuda.autoinit" for a in node.names)) or (
            isinstance(node, ast.ImportFrom) and node.module == "pycuda"
            and any(a.name == "autoinit" for a in node.names)
        )
        if autoinit and uses_gpu_ep:
            findings.append(Finding.of(
                "SCN001",
                f"{shown}:{node.lineno}: 'import pycuda.autoinit' in a program that also uses ORT's CUDA/TensorRT EP: "
                "two owners of the CUDA context",
                fix="create the context yourself (cuda.Device(0).make_context()), push it around your own CUDA work "
                "and pop it before ORT runs, or let ORT own the device (user_compute_stream)",
                source=f"{shown}:{node.lineno}",
            ))
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name != "InferenceSession":
            continue
        providers_arg = next((k.value for k in node.keywords if k.arg == "providers"), None)
        if providers_arg is None and len(node.args) >= 3:
            providers_arg = node.args[2]
        if providers_arg is None:
            findings.append(Finding.of(
                "SCN002",
                f"{shown}:{node.lineno}: InferenceSession created without providers=: which EPs it uses depends on the "
                "installed ORT package (and ORT warns or fails for GPU packages)",
                fix="pass providers=[...] explicitly, e.g. ['CUDAExecutionProvider', 'CPUExecutionProvider']",
                source=f"{shown}:{node.lineno}",
            ))
            continue
        if isinstance(providers_arg, ast.Name) and providers_arg.id in list_values:
            providers_arg = list_values[providers_arg.id]
        names = _strings(providers_arg)
        if "DmlExecutionProvider" in names:
            others = [p for p in names if p in NON_CPU_PROVIDERS]
            if others:
                what = ("OpenVINO with DirectML fails (\"doesn't support memcpy\")"
                        if "OpenVINOExecutionProvider" in others else "DirectML can only share a session with CPU EPs")
                findings.append(Finding.of(
                    "SCN003",
                    f"{shown}:{node.lineno}: providers {names} in one session: {what}",
                    fix="one session per EP",
                    source=f"{shown}:{node.lineno}",
                ))
    return findings


REQUIREMENT = re.compile(r"""^\s*["']?([A-Za-z0-9][A-Za-z0-9._-]*)""")


def _scan_requirements(path: Path, shown: str) -> list[Finding]:
    seen: list[tuple[str, int]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        if path.suffix == ".toml":
            # dependency strings inside pyproject arrays: "onnxruntime-gpu>=1.17",
            for match in re.finditer(r"""["']([A-Za-z0-9][A-Za-z0-9._-]*)""", stripped):
                name = match.group(1).lower().replace("_", "-")
                if name in FLAVOURS:
                    seen.append((name, number))
            continue
        match = REQUIREMENT.match(stripped)
        if match and match.group(1).lower().replace("_", "-") in FLAVOURS:
            seen.append((match.group(1).lower().replace("_", "-"), number))
    flavours = {name for name, _ in seen}
    if len(flavours) > 1:
        line = seen[-1][1]
        return [Finding.of(
            "SCN004",
            f"{shown}:{line}: {', '.join(sorted(flavours))} required side by side: they install the same 'onnxruntime' "
            "module and overwrite each other",
            fix="require exactly one flavour (onnxruntime-gpu already includes the CPU EP)",
            source=f"{shown}:{line}",
        )]
    return []


def scan(root: Path) -> StepResult:
    report = StepResult(step="doctor", schema=SCHEMA)
    root = Path(root)
    files = 0
    for path in _files(root, ("*.py",)):
        files += 1
        shown = str(path.relative_to(root)) if root.is_dir() else path.name
        for finding in _scan_python(path, shown):
            report.add(finding)
    for path in _files(root, ("requirements*.txt", "requirements*.in", "pyproject.toml", "constraints*.txt")):
        files += 1
        shown = str(path.relative_to(root)) if root.is_dir() else path.name
        for finding in _scan_requirements(path, shown):
            report.add(finding)
    report.data = {"scan": {"path": str(root), "files": files}}
    return report


class DoctorStep(Step):
    name = "doctor"
    Options = DoctorOptions

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        if self.options.scan is not None:
            return scan(self.options.scan)
        return doctor(self.options.runtimes, self.options.ort_version)


# pip packages that ship each GPU library, per CUDA major (NVIDIA's wheels on PyPI: for CUDA 13 the
# CUDA runtime and cuBLAS wheels dropped the -cuXX suffix, their -cu13 names being empty
# placeholders; TensorRT's libraries come from NVIDIA's index, pypi.nvidia.com, which the PyPI
# stubs download from)
_GPU_PACKAGES = {
    12: {"cudart": "nvidia-cuda-runtime-cu12", "cublas": "nvidia-cublas-cu12", "cublasLt": "nvidia-cublas-cu12",
         "cudnn": "nvidia-cudnn-cu12", "nvinfer": "tensorrt-cu12-libs"},
    13: {"cudart": "nvidia-cuda-runtime==13.*", "cublas": "nvidia-cublas==13.*", "cublasLt": "nvidia-cublas==13.*",
         "cudnn": "nvidia-cudnn-cu13", "nvinfer": "tensorrt-cu13-libs"},
}


def _gpu_library_fix(key: str, file_name: str, cuda_major: int) -> str:
    """The install line for one missing library, for the CUDA major onnxruntime-gpu was built with
    (TensorRT: the major its EP loads, from the file name, libnvinfer.so.10 -> 10.*)."""
    package = _GPU_PACKAGES.get(cuda_major, {}).get(key)
    if package is None:
        return (f"install the CUDA {cuda_major} build of {file_name} (NVIDIA's packages), then call "
                "onnxruntime.preload_dlls() before creating sessions, or put its folder on LD_LIBRARY_PATH")
    if key == "nvinfer" and file_name.rsplit(".", 1)[-1].isdigit():
        package += f"=={file_name.rsplit('.', 1)[-1]}.*"
    return (f"pip install '{package}' (for the CUDA {cuda_major} build of onnxruntime-gpu), then call "
            "onnxruntime.preload_dlls() before creating sessions, or put its lib folder on LD_LIBRARY_PATH")
