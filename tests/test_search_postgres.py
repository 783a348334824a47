"""A search on a PostgreSQL store, the plain ``postgresql://`` URL of Optuna's documentation (psycopg
3, headwise's ``postgres`` extra): it runs, and a rerun resumes it, adding no trial. The test
starts its own throwaway server (``initdb`` and ``pg_ctl`` into a temporary folder, on a free
port, as the ``postgres`` user when run as root) and is skipped, saying why, where PostgreSQL's
server programs are not installed (``.ci/run`` installs them where it can)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.search.trials import read_record
from test_search_driver import write_search

pytest.importorskip("psycopg", reason="PostgreSQL's driver is the postgres extra (pip install -e '.[postgres]')")
pytestmark = pytest.mark.slow  # a database server and a search end to end


def _server_programs() -> Path | None:
    """The folder of initdb and pg_ctl: Debian's newest /usr/lib/postgresql/N/bin, else the PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    initdb = found[-1] if found else shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_server_user() -> list[str]:
    """The prefix that runs a command as a user PostgreSQL accepts (it refuses to run as root)."""
    if os.geteuid() != 0:
        return []
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root, and there is no postgres user to run the server as")
    if not shutil.which("runuser"):
        pytest.skip("running as root, and there is no runuser to run the server as the postgres user")
    return ["runuser", "-u", "postgres", "--"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server of its own for the module, and the URL of its database."""
    programs = _server_programs()
    if programs is None:
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed: apt-get install postgresql")
    prefix = _as_server_user()
    # not under pytest's tmp_path: the server's user must reach its folder
    folder = Path(tempfile.mkdtemp(prefix="headwise-pg-"))
    data = folder / "data"
    if prefix:
        shutil.chown(folder, user="postgres")
    port = _free_port()

    def server(*argv: str) -> None:
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    try:
        server(str(programs / "initdb"), "-D", str(data), "-U", "headwise", "--auth=trust", "--no-sync", "-E", "UTF8")
        server(str(programs / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", "60", "-o",
               f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        try:
            yield f"postgresql://headwise@127.0.0.1:{port}/postgres"
        finally:
            server(str(programs / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_search_on_postgresql_runs_and_a_rerun_resumes_it(postgres_url, tmp_path, capsys):
    import optuna

    src = write_search(tmp_path / "s.toml", trials=1, named=[])
    out = tmp_path / "out"
    command = ["search", str(src), "--out", str(out), "--storage", postgres_url]
    assert main(command) == 0
    assert "started trial 0000" in capsys.readouterr().out
    assert [t["state"] for t in read_record(out)["trials"]] == ["complete"]
    assert not (out / "optuna.db").exists()  # the trials are in the server's store
    assert main(command) == 0
    again = capsys.readouterr().out
    assert "1 already finished" in again and "started trial" not in again
    study = optuna.load_study(study_name="headwise-search", storage=postgres_url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
