"""A Ray address that is no cluster answers in seconds, in one line: nothing listening (``HOST:PORT``
or ``ray://HOST:PORT``, for a search and a study alike) is exit 2 after a TCP probe, before Ray
is asked; a port that listens but never lets the driver join is refused after a deadline; and
SIGTERM stops the command while Ray tries to join. Each runs ``headwise`` in a subprocess: Ray,
blocked in its C++ code, would otherwise hold the test for minutes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from test_search_driver import BASE, write_search

pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'headwise[ray]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}


def _headwise(*argv: str, join_s: float | None = None) -> list[str]:
    """The command line of ``headwise ARGV`` in a fresh interpreter (``join_s``: the join deadline)."""
    code = "import sys; from headwise.cli import main; "
    if join_s is not None:
        code += f"import headwise.study.ray_backend as rb; rb.JOIN_S = {join_s}; "
    return [sys.executable, "-c", code + "sys.exit(main(sys.argv[1:]))", *argv]


def _one_line_refusal(argv: list[str], tmp_path: Path, limit_s: float) -> str:
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=limit_s + 60)
    took = time.monotonic() - t0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert took < limit_s, f"took {took:.0f} s"
    return lines[0]


def _study_file(path: Path) -> Path:
    """A study of one short run of the nearest-neighbour task."""
    path.write_text(tomli_w.dumps({"name": "one", "base": BASE, "variants": [{"name": "a", "set": {}}]}))
    return path


@pytest.mark.parametrize("form", ["{}", "ray://{}"])
def test_a_search_at_an_address_where_nothing_listens_is_one_line_in_seconds(form, tmp_path):
    src = write_search(tmp_path / "s.toml")
    address = form.format(f"127.0.0.1:{_free_port()}")
    line = _one_line_refusal(_headwise("search", str(src), "--out", "out", "--backend", "ray", "--address", address),
                             tmp_path, limit_s=15)
    assert "no Ray cluster at 127.0.0.1:" in line and "ray start --head" in line and "drop --address" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


def test_a_study_at_an_address_where_nothing_listens_is_one_line_in_seconds(tmp_path):
    src = _study_file(tmp_path / "study.toml")
    line = _one_line_refusal(_headwise("study", str(src), "--out", "out", "--backend", "ray", "--address",
                                       f"127.0.0.1:{_free_port()}"), tmp_path, limit_s=15)
    assert "no Ray cluster at 127.0.0.1:" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml"]


@pytest.mark.slow
def test_a_port_that_listens_but_is_no_cluster_is_refused_after_the_deadline(tmp_path):
    src = write_search(tmp_path / "s.toml")
    with socket.socket() as server:
        server.bind(("", 0))  # every interface: Ray may swap 127.0.0.1 for the node's address
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        line = _one_line_refusal(_headwise("search", str(src), "--out", "out", "--backend", "ray", "--address",
                                           address, join_s=3), tmp_path, limit_s=30)
    assert f"the Ray cluster at {address} did not let this driver join within 3 s" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


@pytest.mark.slow
def test_sigterm_stops_a_search_while_ray_tries_to_join(tmp_path):
    """Ray retries a silent cluster in C++, where Python runs no signal handler: the command must
    still stop on SIGTERM, as an interrupt."""
    src = write_search(tmp_path / "s.toml")
    with socket.socket() as server:
        server.bind(("", 0))  # every interface: Ray may swap 127.0.0.1 for the node's address
        server.listen()
        server.settimeout(120)
        proc = subprocess.Popen(_headwise("search", str(src), "--out", "out", "--backend", "ray", "--address",
                                          f"127.0.0.1:{server.getsockname()[1]}"),
                                cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            server.accept()[0].close()  # the command reached the cluster: it is joining (or probing) now
            time.sleep(3)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130 and err.strip() == "headwise: interrupted", (proc.returncode, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
