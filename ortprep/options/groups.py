"""Options that several commands share, each declared once (Polygraphy's argument groups are the
model): a group fixes the option's kind, flags, metavar, grammar and checks; the command that uses it
says only what the option is for there. Step Options, ``package`` and the docs all read these."""

from __future__ import annotations

from typing import Any

from ortprep.errors import UsageError
from ortprep.options.fields import Kind, option

DEVICE_HELP = ("The device the QNN target is for: a SoC name (x-elite, 8-elite, 8gen3, sm8650, ...; ortprep check "
               "--list-eps) or soc_model=N. Default: x-elite (Snapdragon X Elite), stated in the report.")

# What --metric accepts, said once for the commands that hold a result to it (quantize says more).
METRIC_KINDS = ("top1[:THRESHOLD], argmax[:positions], map[:THRESHOLD[:exact]], detect[:THRESHOLD] (a YOLO-style "
                "detector: class scores and "
                "boxes), ctc[:BLANK] (a CTC recogniser: its decoded strings, in place of the cosine), dfl[:BINS] "
                "(a DFL box head: each side's decoded distance) or cosine (none)")
METRIC_KINDS_DETAILED = (
    "top1[:THRESHOLD] (class scores; with a threshold, the top class's probability held there too), "
    "argmax[:positions] (per-position, e.g. CTC, and whole sequences; :positions, each position alone), "
    "map[:THRESHOLD[:exact]] (probability map, F1, its regions matched at IoU 0.5; :exact, identical boxes), "
    "detect[:THRESHOLD] (a YOLO-style [1, 4 + C, N] detector: class scores at the threshold, default 0.25, and the "
    "kept boxes), ctc[:BLANK] (a CTC recogniser's greedy-decoded strings and line scores, blank 0 unless given; in "
    "place of the output's cosine), dfl[:BINS] (a DFL box head, [..., 4 x BINS]: each box side's expected distance, "
    "99% within a quarter bin), cosine (none)")


def metrics_option(purpose: str, kinds: str = METRIC_KINDS) -> Any:
    """--metric OUTPUT=KIND: what the application reads from an output (``purpose``: what the command
    holds to it)."""
    return option({}, f"What the application reads from an output, {purpose}: OUTPUT={kinds}; inferred from each "
                  "output's form when not given (repeatable).", Kind.METRICS, flags=("--metric", "--metrics"),
                  metavar="OUTPUT=KIND")


def runtimes_option(help: str) -> Any:
    """--runtime EP=PYTHON: an EP run under another environment's Python (its own ORT flavour)."""
    return option({}, help, Kind.RUNTIMES, flags=("--runtime", "--runtimes"), metavar="EP=PYTHON")


def provider_options_option(help: str) -> Any:
    """--provider-option EP:KEY=VALUE: an EP's session option, as the application sets it."""
    return option({}, help, Kind.PROVIDER_OPTIONS, flags=("--provider-option", "--provider-options"),
                  metavar="EP:KEY=VALUE")


def device_option() -> Any:
    """--device: the device a QNN target is for (checked with :func:`check_device`)."""
    return option(None, DEVICE_HELP, Kind.TEXT, metavar="DEVICE")


def data_option(help: str) -> Any:
    """--calib / --eval DATA: samples (a folder of .npz/.npy/images, a stacked .npz, or 'random')."""
    return option(None, help, Kind.DATA, metavar="DATA")


def min_share_option(purpose: str) -> Any:
    """--min-share SHARE: the least share of the model's nodes the EP must run (0 < SHARE <= 1;
    checked with :func:`check_share`). Without it, an EP asked for that runs none fails alone."""
    return option(None, f"Fail (exit 1) when the EP runs less than this share of the model's nodes, {purpose}, "
                  "e.g. 0.9; without it, only an EP that runs none of the model fails.", Kind.FLOAT, minimum=0.0,
                  metavar="SHARE")


def check_share(share: float | None, where: str) -> None:
    """--min-share is a share of the nodes: above 0, at most 1."""
    if share is not None and not 0 < share <= 1:
        raise UsageError(f"{where}: --min-share {share:g} is not a share of the nodes",
                         hint="give a number above 0 and at most 1, e.g. --min-share 0.9")


def shapes_option(help: str) -> Any:
    """--shape NAME=DIMS: the feed shape of a symbolic input."""
    return option({}, help, Kind.SHAPES, flags=("--shape", "--shapes"), metavar="NAME=DIMS")


def check_device(device: str | None, eps: list[str], provider_options: dict[str, dict[str, str]], where: str) -> None:
    """--device names a device of one of the EPs (today: qnn), and does not contradict a soc_model
    given as a provider option."""
    from ortprep.eps.devices import has_devices, resolve_device
    from ortprep.eps.registry import resolve_ep

    if device is None:
        return
    names = {resolve_ep(part).name for label in eps for part in label.split(",")}
    with_devices = [name for name in names if has_devices(name)]
    if eps and not with_devices:
        raise UsageError(f"{where}: --device names a QNN device, and no target here is qnn",
                         hint="drop --device, or add --ep qnn")
    try:
        for name in with_devices or ["qnn"]:
            chosen = resolve_device(name, device)
            given = provider_options.get(name, {}).get("soc_model")
            if given is not None and given != chosen.provider_options.get("soc_model"):
                raise UsageError(f"--device {device} is soc_model {chosen.provider_options.get('soc_model')}, but "
                                 f"--provider-option {name}:soc_model={given} says otherwise",
                                 hint="give one of the two")
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None

