"""Running one ortprep command as a user runs it, for the suite's scripts: in a child process under a
small launcher (its own peak RSS, a timeout that ends its whole process group), with its --json
report read back; and the state of the ortprep code a run measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.paths import ROOT

ORTPREP = [sys.executable, "-m", "ortprep"]

# A step runs under this launcher so that its peak RSS is its own (Linux carries a process's peak
# across fork and exec, so this benchmark must not be the parent it is measured from), and so that
# a timeout ends the step's whole process group (ortprep's workers included).
_LAUNCHER = r"""
import os, signal, subprocess, sys, threading
stdout, stderr, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(stdout, "wb") as out, open(stderr, "wb") as err:
    child = subprocess.Popen(sys.argv[4:], stdout=out, stderr=err, start_new_session=True)
    reaped = {}
    waiter = threading.Thread(target=lambda: reaped.update(result=os.wait4(child.pid, 0)), daemon=True)
    waiter.start()
    waiter.join(timeout)
    timed_out = waiter.is_alive()
    if timed_out:
        os.killpg(child.pid, signal.SIGKILL)
        waiter.join()
    _, status, usage = reaped["result"]
print("timeout" if timed_out else os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def launch(
    argv: list[str], stdout: Path, stderr: Path, timeout: float, cwd: Path = ROOT
) -> tuple[int | str, float, float]:
    """Run ``argv`` under the launcher: (exit code or "timeout", seconds, peak RSS in MB)."""
    started = time.perf_counter()
    launcher = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(stdout), str(stderr), str(timeout), *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    seconds = time.perf_counter() - started
    try:
        code, maxrss = launcher.stdout.split()
    except ValueError:
        return f"launcher failed: {launcher.stderr.strip()[-200:]}", seconds, 0.0
    return (code if code == "timeout" else int(code)), seconds, int(maxrss) / 1024


def ortprep(step: str, args: list, folder: Path, timeout: float) -> dict:
    """One ortprep command with --json: its exit, time, peak RSS, JSON report and stderr's tail."""
    stdout, stderr = folder / f"{step}.json", folder / f"{step}.stderr"
    code, seconds, rss = launch([*ORTPREP, *args, "--json"], stdout, stderr, timeout)
    entry = {"command": "ortprep " + " ".join(shown(a) for a in args) + " --json", "exit": code,
             "seconds": round(seconds, 1), "peak_rss_mb": round(rss)}
    try:
        entry["report"] = json.loads(stdout.read_text())
    except (OSError, json.JSONDecodeError):
        entry["report"] = None
    text = stderr.read_text(errors="replace") if stderr.exists() else ""
    entry["traceback"] = "Traceback (most recent call last)" in text
    if entry["report"] is None or code not in (0, 1) or entry["traceback"]:
        entry["stderr_tail"] = text.strip()[-1500:]
    return entry


def shown(arg) -> str:
    text = str(arg)
    return text.replace(str(ROOT) + "/", "") if text.startswith(str(ROOT)) else text


def tree_state() -> dict:
    """The ortprep code the steps ran: the commit, the uncommitted files under ortprep/, and a digest
    of their contents (others work in the same tree; a run is only one run of one code if the
    digest is the same at its start and its end)."""
    import hashlib

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout

    changed = sorted(line[3:] for line in git("status", "--porcelain", "--", "ortprep").splitlines())
    digest = hashlib.sha256(git("diff", "HEAD", "--", "ortprep").encode())
    for name in changed:
        path = ROOT / name
        if path.is_file():
            digest.update(path.read_bytes())
    return {
        "head": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": changed,
        "digest": digest.hexdigest()[:12],
    }
