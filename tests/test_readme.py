"""The README's set-up is what CI runs, and it describes the lock and the torch pin as what they are."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up.*?```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    # in .ci/run, each command the README shows follows a comment naming it
    ci = re.findall(r"# README: (install|test)\n\s*(.+?)(?: ;;)?\n", (ROOT / ".ci" / "run").read_text())
    assert [command for _, command in ci] == block == [
        'python3 -m pip install -c requirements.lock -e ".[dev]"', "python3 -m pytest"]


def test_the_lock_and_the_torch_pins_agree_and_the_pin_is_described_as_a_version_pin():
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert [p.split("==")[0] for p in pins] == ["torch", "torchvision"]
    lock = (ROOT / "requirements.lock").read_text()
    for pin in pins:
        assert re.search(rf"^{re.escape(pin)}$", lock, re.M), pin
    torch_version = pins[0].split("==")[1]
    readme = (ROOT / "README.md").read_text()
    assert "pins the CPU build" not in readme
    assert f"PyTorch's *build* is not locked, only its version ({torch_version}" in readme


def test_output_piped_into_a_reader_that_quits_gives_no_traceback():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m headwise study --list | head -1", shell=True,
                          capture_output=True, text=True)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr
