"""`ortprep init`: a starter ortprep.toml for the models in a folder, with the targets this
machine can run and comments that say what each gate means."""

from __future__ import annotations

from pathlib import Path


def available_targets() -> list[str]:
    """EPs a session can use here (CPU always), in the order a repository would want them."""
    from ortprep.eps.registry import EPS
    from ortprep.runtime.providers import probe_runtime

    probe = probe_runtime()
    found = [s.name for s in EPS if probe.ok and probe.runs(s.name) and s.name != "cpu"]
    return ["cpu"] + found


def _glob_for(models: list[Path], folder: Path) -> list[str]:
    """One glob per folder that holds models (models/*.onnx), relative to ``folder``."""
    parents = sorted({m.parent.resolve() for m in models})
    globs = []
    for parent in parents:
        relative = parent.relative_to(folder.resolve()) if parent != folder.resolve() else Path(".")
        globs.append(str(relative / "*.onnx") if str(relative) != "." else "*.onnx")
    return globs


def starter_config(folder: Path) -> str:
    from ortprep.config import find_models

    folder = Path(folder)
    models = find_models(folder)
    if not models:
        from ortprep.errors import UsageError

        raise UsageError(f"no .onnx file under {folder}",
                         hint="run ortprep init in the repository that holds the models")
    targets = available_targets()
    lines = [
        "# ortprep.toml: the CI gate of this repository (written by `ortprep init`; see docs/pipeline.md).",
        "# Run it with: ortprep run        (add -j N for N models in parallel, --junit/--markdown/--html for reports)",
        "",
        'output_dir = "build/ortprep"   # models the steps write, per model and target',
        'fail_on = "error"              # a step fails on findings of this severity or worse: error, warning, info, '
        'never',
        "",
    ]
    for pattern in _glob_for(models, folder):
        lines += ["[[models]]", f'path = "{pattern}"',
                  "# shapes = { input = [1, 3, 224, 224] }  # sizes of symbolic inputs, if any",
                  '# data = "data/calib"                   # real samples for quantize (calibration) and evaluation',
                  ""]
    for ep in targets:
        lines += [f"[targets.{ep.replace('-', '_')}]", f'ep = "{ep}"',
                  "# The gates. Each compares what `check` (and `load`) measured for this target:",
                  "min_node_share = 0.0        # least share of nodes on the EP (0.95: at most 5% fall back to the "
                  "CPU)",
                  "# min_mac_share = 0.9       # least share of the multiply-accumulates on the EP",
                  "# max_partitions = 1        # most EP partitions (each boundary is a copy between EP and CPU "
                  "memory)",
                  "# max_fallback_nodes = 0    # most nodes that run on the CPU instead",
                  "# no_cpu_island = true      # no CPU node between two EP nodes (a round trip EP -> CPU -> EP)",
                  "load_must_pass = true       # the model loads and runs on this EP where the runner has it",
                  "# min_cosine = 0.99         # accuracy gate of convert and quantize steps", ""]
    lines += [
        "# The steps, run in order on every model for every target (each step gets the target's EP).",
        "[[steps]]",
        'run = "check"',
        "",
        "[[steps]]",
        'run = "load"',
        "",
        "# Finding codes that must not fail the run, each with the reason (docs/cli.md lists the codes).",
        "[ignore]",
        '# CHK004 = "why it does not matter here"',
        "",
    ]
    return "\n".join(lines)
