"""Byte code made once per run, by pytest-xdist's controller, instead of in every process.

This machine sets ``PYTHONDONTWRITEBYTECODE``: no process writes a ``.pyc``, so each one compiled
the project's sources again, and each test process rewrote the asserts of every test module
again (about 9 s of CPU of its 11 s of collection). The test processes, and the worker,
gunicorn, Celery and Django processes the tests start, still read what is in ``__pycache__``.
So the controller, while its migration of the template database runs in a subprocess, compiles
the checkout's sources (``compileall``'s pycs, checked against the source's mtime at import) and
writes pytest's rewritten test modules (checked against a hash of the source). A file it cannot
compile is left to the process that imports it, which reports it as it always did. The files
land in ``__pycache__`` directories, which git ignores and the wheel's and the tutorial's copies
of the tree leave out.
"""

from __future__ import annotations

import compileall
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

# Directories that hold no source of the checkout's own: environments, dependencies, output.
NOT_SOURCE = frozenset({".git", "node_modules", "__pycache__", "site", "var", "build", "dist"})


def python_sources(root: Path) -> Iterator[Path]:
    """The checkout's ``.py`` files, in a stable order, leaving out virtualenvs (``.venv*``),
    Node's packages and build output."""
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in NOT_SOURCE
            and not name.startswith(".")
            and not name.endswith(".egg-info")
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory, name)


def is_test_module(path: Path, patterns: Iterable[str]) -> bool:
    return path.name == "conftest.py" or any(path.match(pattern) for pattern in patterns)


def sources_compile(root: Path, *, tests: Iterable[str] = ()) -> int:
    """Compile the checkout's sources into their ``__pycache__``, but for the test modules
    (``tests``: ``python_files``' patterns), which pytest compiles its own way; answer how many
    failed."""
    tests = tuple(tests)
    failed = 0
    for path in python_sources(root):
        if is_test_module(path, tests):
            continue
        if not compileall.compile_file(path, quiet=2):
            failed += 1
    return failed


def rewritable_modules(config: pytest.Config, args: Iterable[str]) -> list[Path]:
    """The test modules and conftest files under the run's paths (``python_files``)."""
    patterns = config.getini("python_files")
    found: list[Path] = []
    for arg in args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [p for p in python_sources(path) if is_test_module(p, patterns)]
    return found


def modules_rewrite(config: pytest.Config, modules: Iterable[Path]) -> int:
    """Write pytest's assert-rewritten pyc of each module, where a test process looks for it
    (it reads one whatever ``PYTHONDONTWRITEBYTECODE`` says); answer how many were left to
    the processes. pytest keeps no public call for this: the names are its own, pinned with
    it in requirements.txt."""
    from _pytest.assertion.rewrite import (
        PYC_TAIL,
        _read_pyc,
        _rewrite_test,
        _write_pyc,
        assertstate_key,
        get_cache_dir,
        try_makedirs,
    )

    state = config.stash[assertstate_key]
    left = 0
    for module in modules:
        cache = get_cache_dir(module)
        pyc = cache / (module.name[:-3] + PYC_TAIL)
        if _read_pyc(module, pyc, state.trace) is not None:
            continue  # written by an earlier run, and the source's hash still matches
        try:
            source_hash, code = _rewrite_test(module, config)
        except (OSError, SyntaxError, ValueError):
            left += 1  # the process importing it reports the error
            continue
        if not (try_makedirs(cache) and _write_pyc(state, code, source_hash, pyc)):
            left += 1
    return left


_AHEAD = pytest.StashKey[threading.Thread]()


def compile_ahead_start(config: pytest.Config) -> None:
    """In the controller: compile and rewrite in a thread, beside the template's migration and
    the processes' start-up (both spend their time in other processes); pytest_unconfigure
    waits for it (``compile_ahead_join``)."""
    if config.getoption("assertmode") != "rewrite":
        modules: list[Path] = []
    else:
        modules = rewritable_modules(config, config.args)

    def work() -> None:
        # In the order the processes need them: the apps at Django's setup, then the tests.
        sources_compile(config.rootpath, tests=config.getini("python_files"))
        modules_rewrite(config, modules)

    thread = threading.Thread(target=work, name="compile-ahead", daemon=True)
    thread.start()
    config.stash[_AHEAD] = thread


def compile_ahead_join(config: pytest.Config) -> None:
    if _AHEAD in config.stash:
        config.stash[_AHEAD].join()
