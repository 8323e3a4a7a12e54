"""Measure, for each ONNX Runtime release, the newest ONNX IR version and default-domain opset it
loads, and write ortprep/eps/data/ort_versions.json (what `--ort-version` checks against).

    .venv/bin/python tools/probe_ort_versions.py [VERSION ...]

Each release is installed into a throw-away environment (pip, from the package registry) and
asked to create sessions for tiny Identity models stamped with each IR version and opset; the
highest it accepts is the fact, recorded with the date and the wheel's version.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "ortprep" / "eps" / "data" / "ort_versions.json"
DEFAULT = ["1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.21.1", "1.22.1", "1.23.2", "1.24.4", "1.25.1", "1.26.0",
           "1.27.0", "1.28.0", "1.29.0", "1.30.0", "1.31.1", "1.32.0"]

PROBE = r"""
import json, sys
import onnxruntime as ort
from onnx import TensorProto, helper
options = ort.SessionOptions(); options.log_severity_level = 4
def accepts(ir, opset):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False
opset = max(o for o in range(7, 40) if accepts(7, o))
ir = max(i for i in range(3, 20) if accepts(i, 7))
print(json.dumps({"version": ort.__version__, "max_opset": opset, "max_ir_version": ir}))
"""


def probe(version: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = Path(tmp) / "env"
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        python = str(env / "bin" / "python")
        subprocess.run(
            [python, "-m", "pip", "install", "-q", f"onnxruntime=={version}", "onnx", "numpy<2.3"],
            check=True,
            capture_output=True,
        )
        out = subprocess.run([python, "-c", PROBE], check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    versions = sys.argv[1:] or DEFAULT
    data = json.loads(TARGET.read_text()) if TARGET.exists() else {"releases": {}}
    today = datetime.date.today().isoformat()
    for version in versions:
        try:
            found = probe(version)
        except subprocess.CalledProcessError as exc:
            print(f"{version}: {exc.stderr.strip()[-300:] if exc.stderr else exc}", file=sys.stderr)
            continue
        minor = ".".join(version.split(".")[:2])
        data["releases"][minor] = {
            "max_ir_version": found["max_ir_version"],
            "max_opset": found["max_opset"],
            "source": f"measured: onnxruntime {found['version']} CPU wheel loads tiny models, {today}",
        }
        print(minor, data["releases"][minor], flush=True)
    data["about"] = ("Newest ONNX IR version and default-domain opset each ONNX Runtime release loads, measured by "
                     "tools/probe_ort_versions.py (one fact per minor release).")
    data["releases"] = dict(sorted(data["releases"].items(), key=lambda kv: tuple(int(p) for p in kv[0].split("."))))
    TARGET.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
