"""What a newcomer meets first: the README and docs name commands that exist, and the repository
root holds no stray models (issue 23: the README still said `ortprep load` (coming) after load had
shipped; l.onnx and l16.onnx sat at the root)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import typer.main

from conftest import ROOT
from ortprep.cli.app import app

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code(text: str) -> list[str]:
    """The code in a Markdown text: fenced blocks and inline spans (prose says 'ortprep is ...')."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def test_docs_name_only_commands_that_exist():
    commands = set(typer.main.get_command(app).commands)
    for doc in DOCS:
        text = doc.read_text()
        named = {word for code in _code(text) for word in re.findall(r"(?:^|[\s/])ortprep ([a-z][a-z-]*)", code, re.M)}
        assert named <= commands, (doc.name, sorted(named - commands))
        assert not re.search(r"\((?:coming|coming soon|planned|not yet)\)", text, re.I), doc.name
    listed = re.search(r"^Commands: (.*?)\n\n", (ROOT / "README.md").read_text(), re.S | re.M)
    assert listed is not None
    assert set(re.findall(r"`([a-z-]+)`", listed.group(1))) <= commands


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_model_files_at_the_repository_root():
    """Models live in sample_models/ (built by its script) or tmp_path; one at the root is a
    leftover of a manual run, tracked or about to be (untracked and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.onnx", "*.onnx.data"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [path for path in listed if "/" not in path] == []
