"""Run (or resume, or join) a search: every check first, then the store, the trials, the
confirmation.

Nothing is written before the checks pass: the search (resolved when it was loaded: space,
budget, objectives, named plans, confirmation), the output folder (empty, new, or this same
search; a changed one only with ``new``), the torch threads and version its trials ran with, a
``--storage`` URL (it must open), the device and the data (prepared once, outside the folder).
With ``backend="ray"`` the device, the data and the search folder are checked on the cluster
(:class:`~headwise.search.execute.RayLauncher`): its nodes run the trials, this process drives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from headwise.errors import HeadwiseError, RunFailure
from headwise.search import layout
from headwise.search.definition import Search
from headwise.search.execute import LocalLauncher, RayLauncher
from headwise.locks import FileLock
from headwise.search.record import OPTUNA_DB
from headwise.study.definition import RunSpec
from headwise.study.preflight import check_out_dir
from headwise.study.runner import check_environment, check_options, default_threads


@dataclass
class SearchOutcome:
    """What a search run ended with."""

    search_dir: Path
    record: dict[str, Any]
    #: trials that failed in this run (rerunning asks new ones in their place)
    failed: list[int]
    #: the driver's own time against its trials' (driver.json)
    timing: dict[str, Any]
    #: True when this driver ran as a worker (no confirmation)
    worker: bool = False
    confirm: Any = None
    #: why the confirmation did not complete (some of its runs failed: a rerun retries them)
    confirm_failure: str = ""


def storage_url(search_dir: Path, storage: str | None) -> str:
    """``storage``, or the SQLite file ``optuna.db`` inside the search folder."""
    return storage or f"sqlite:///{(search_dir / OPTUNA_DB).resolve()}"


def run_search(search: Search, out_dir: str | Path | None = None, *, jobs: int | None = None,
               threads: int | None = None, storage: str | None = None, worker: bool = False, new: bool = False,
               confirm: bool = True, confirm_report: Callable[[Path], Path] | None = None,
               backend: str = "local", address: str | None = None,
               echo: Callable[[str], None] = print) -> SearchOutcome:
    """Run (or resume) ``search`` into ``out_dir`` until it has its trials, then (the main driver,
    unless ``confirm`` is False or the search says not to) its confirmation study, whose report
    ``confirm_report`` writes. Each trial's run is a subprocess here (``backend="local"``) or a
    Ray task on the cluster at ``address`` (``"ray"``). A HeadwiseError before anything is
    written for bad input."""
    from headwise.search.store import check_store, open_storage

    check_options(backend, address, jobs, threads)
    jobs = jobs or search.config.runner.jobs or 1
    search_dir = Path(out_dir) if out_dir is not None else search.default_out("searches_out")
    saved = layout.check_search_dir(search, search_dir, new)
    if new and saved == {} and not (search_dir / layout.SEARCH_TOML).is_file():
        new = False  # nothing to move aside
    if worker and new:
        raise HeadwiseError("--worker joins a search another driver runs; --new starts one afresh: give one of them")
    if worker and not saved:  # it would train every trial with no driver to confirm or report them
        raise HeadwiseError(f"--worker: --out {search_dir} holds no search to join; start the search there without "
                            "--worker first, then add workers")
    environment = check_environment(search_dir, {} if new else saved.get("environment", {}),
                                    threads or search.config.runner.threads, default_threads(jobs, backend))
    check_out_dir(search_dir)
    if saved and not new:  # a rerun keeps the store the search started with ("": its own SQLite file)
        kept = saved.get("storage") or None
        if storage is not None and storage != kept:
            raise HeadwiseError(f"--out {search_dir} keeps its trials in {kept or 'its own optuna.db'}: rerun with "
                                + (f"--storage {kept}" if kept else "no --storage") + ", or pass --new")
        storage = kept
    example = next(search.space.plans(limit=1))
    specs = [RunSpec("trial", search.config.fidelity.run_seed, {}, search.trial_config(example))]
    launcher = LocalLauncher() if backend == "local" else RayLauncher(address)
    try:
        launcher.preflight(specs, search_dir, environment["threads"], echo)
        own = search_dir / OPTUNA_DB
        # last: a URL that opens makes its database (one that does not writes nothing); the
        # folder's own store is opened only when it is there to resume
        if storage is not None or (not new and own.is_file()):
            from headwise.search.store import STUDY_NAME

            store = open_storage(storage_url(search_dir, storage), own if storage is None else None)
            if not new:  # its study of this search's name must be this search's
                check_store(search, store, saved.get("study_name", STUDY_NAME))
            store.remove_session()
        return _drive(search, search_dir, saved, environment, storage, launcher, jobs=jobs, worker=worker, new=new,
                      confirm=confirm, confirm_report=confirm_report, backend=backend, address=address, echo=echo)
    finally:
        launcher.close()


def _drive(search: Search, search_dir: Path, saved: dict[str, Any], environment: dict[str, Any], storage: str | None,
           launcher: LocalLauncher | RayLauncher, *, jobs: int, worker: bool, new: bool, confirm: bool,
           confirm_report: Callable[[Path], Path] | None, backend: str, address: str | None,
           echo: Callable[[str], None]) -> SearchOutcome:
    """:func:`run_search` once every check has passed: make the folder, open the store, run the
    trials, then the confirmation (on the same backend)."""
    from headwise.search.driver import Driver, enqueue_named
    from headwise.search.store import STUDY_NAME, open_storage, open_study
    from headwise.search.trials import write_record

    search_dir.mkdir(parents=True, exist_ok=True)
    search_dir = search_dir.resolve()
    main_lock = FileLock(search_dir / ".lock")
    main = not worker and main_lock.acquire()
    if not worker and not main:
        echo(f"another driver is running search {search.name} in {search_dir}: joining it as a worker")
    try:
        with FileLock(search_dir / ".init.lock"):
            if new and main:
                echo(f"--new: the earlier search moved into {layout.move_aside(search_dir)}")
            elif new:
                raise HeadwiseError("--new starts a search afresh: stop the driver running in --out first")
            url = storage_url(search_dir, storage)
            study_name = saved.get("study_name", STUDY_NAME) if not new else _fresh_name(search_dir, storage)
            layout.save_search(search, search_dir, environment, storage or "", study_name)
            study = open_study(search, open_storage(url), study_name)
            enqueue_named(search, study)
            if main or "n_trials" not in study.user_attrs:
                study.set_user_attr("n_trials", search.config.trials)
        driver = Driver(search, search_dir, study, jobs=jobs, threads=environment["threads"], main=main, echo=echo,
                        launcher=launcher)
        driver.target = int(study.user_attrs.get("n_trials", search.config.trials))
        done = sum(1 for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED"))
        echo(f"search {search.name}" + (f" (preset {search.preset})" if search.preset else "")
             + f": {driver.target} trials, {done} already finished, {jobs} at a time"
             + (f" on Ray{f' at {address}' if address else ''}" if backend == "ray" else "")
             + ("" if main else " (worker)") + f" -> {search_dir}")
        driver.run()
        record = write_record(search_dir, search, study.get_trials(deepcopy=False))
        timing = driver.timing.to_dict()
        if main:
            layout.save_driver_timing(search_dir, timing)
        outcome = SearchOutcome(search_dir, record, driver.failed, timing, worker=not main)
        if main and confirm and search.config.confirm.enabled:
            from headwise.search.confirm import run_confirmation

            try:
                outcome.confirm = run_confirmation(search, search_dir, record, jobs=jobs, threads=environment["threads"],
                                                   report=confirm_report, echo=echo, backend=backend, address=address)
            except RunFailure as exc:  # the search's report is still written; the command fails after it
                outcome.confirm_failure = str(exc)
        return outcome
    finally:
        main_lock.release()


def _fresh_name(search_dir: Path, storage: str | None) -> str:
    """The study name of a search started afresh: its own SQLite file starts empty, a shared store
    keeps the earlier study under its name."""
    from headwise.search.store import STUDY_NAME

    if storage is None:
        return STUDY_NAME
    previous = sum(1 for p in search_dir.iterdir() if p.name.startswith("previous-"))
    return f"{STUDY_NAME}-{previous + 1}"
