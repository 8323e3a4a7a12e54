"""The share of a model an EP runs, as a gate (load, check --prove and compile; issue 52): an EP
asked for that runs none of the model is a failure, not a fallback (the session still runs, on the
CPU EP, which is the silent fallback users meet), and ``--min-share`` asks for more than none."""

from __future__ import annotations

from collections.abc import Iterable


def share_shortfall(ep: str, on_ep: int, total: int, left_on_cpu: Iterable[str], min_share: float | None,
                    where: str = "its session") -> str | None:
    """Why ``ep``'s share of the nodes fails the gate (one sentence naming the share and the nodes
    left on the CPU EP), or None where it holds: none run on the EP, or fewer than ``min_share``."""
    if total <= 0:
        return None
    share = on_ep / total
    if on_ep > 0 and (min_share is None or share >= min_share):
        return None
    left = sorted(name for name in left_on_cpu if name)
    shown = ", ".join(left[:8]) + (f", ... ({len(left)} in all)" if len(left) > 8 else "")
    if on_ep == 0:
        said = f"{ep} runs none of the model's {total} node(s) in {where}: every node runs on the CPU EP"
    else:
        said = (f"{ep} runs {on_ep} of the model's {total} node(s) in {where} ({share:.1%}), below --min-share "
                f"{min_share:g}")
    return said + (f"; left on the CPU EP: {shown}" if shown and on_ep else "")


def share_fix(ep: str, model: str = "MODEL") -> str:
    """What to do about a share that fails the gate."""
    return (f"ortprep check {model} --ep {ep} names why each node stays off {ep} and the fix for it; "
            f"--min-share sets the share this command asks for")
