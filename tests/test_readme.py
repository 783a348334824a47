"""The README's set-up is what CI runs, and it describes the torch pin as what it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up.*?```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", "export "))]
    assert ci == block == ['python3 -m pip install -c constraints.txt -e ".[dev]"', "python3 -m pytest"]


def test_the_torch_pin_is_described_as_a_version_pin():
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert pins == ["torch==2.13.0"]
    readme = (ROOT / "README.md").read_text()
    assert "pins the CPU build" not in readme and "pins PyTorch's *version* (2.13.0), not its build" in readme


def test_output_piped_into_a_reader_that_quits_gives_no_traceback():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m headwise study --list | head -1", shell=True,
                          capture_output=True, text=True)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr
