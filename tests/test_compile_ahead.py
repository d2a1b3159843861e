"""The byte code pytest-xdist's controller makes once for every process (tests.compile_ahead)."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc

from tests.compile_ahead import modules_rewrite, python_sources, rewritable_modules, sources_compile

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = ("test_*.py", "*_test.py")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def rewritten_pyc(module: Path) -> Path:
    return module.parent / "__pycache__" / (module.name[:-3] + PYC_TAIL)


def test_the_sources_are_the_checkouts_own_without_environments_dependencies_or_output(tmp_path):
    for name in ("app/models.py", "app/sub/views.py", "manage.py"):
        write(tmp_path / name, "X = 1\n")
    for name in (
        ".venv/lib/site.py",
        ".venv-docs/lib/mkdocs.py",
        "localsqs/node_modules/pkg/gyp.py",
        "build/lib/app/models.py",
        "app.egg-info/x.py",
        ".git/hooks/hook.py",
        "app/__pycache__/stray.py",
        "site/search.py",
        "var/log.py",
    ):
        write(tmp_path / name, "X = 1\n")
    write(tmp_path / "app/notes.txt", "not python")

    found = [path.relative_to(tmp_path).as_posix() for path in python_sources(tmp_path)]

    assert found == ["manage.py", "app/models.py", "app/sub/views.py"]


def test_the_sources_are_compiled_where_an_import_reads_them_and_the_tests_left_to_pytest(
    tmp_path,
):
    source = write(tmp_path / "app/models.py", "X = 1\n")
    test = write(tmp_path / "app/test_models.py", "def test_x():\n    assert True\n")
    conftest = write(tmp_path / "conftest.py", "")

    assert sources_compile(tmp_path, tests=PATTERNS) == 0

    pyc = Path(importlib.util.cache_from_source(str(source)))
    assert pyc.is_file()
    # The header a plain import checks: the source's mtime and size, so an edit makes it stale.
    header = pyc.read_bytes()[:16]
    assert header[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime)
    assert not Path(importlib.util.cache_from_source(str(test))).exists()
    assert not Path(importlib.util.cache_from_source(str(conftest))).exists()


def test_a_source_that_does_not_compile_is_counted_and_the_others_still_are(tmp_path):
    broken = write(tmp_path / "app/a_broken.py", "def (:\n")
    good = write(tmp_path / "app/b_good.py", "X = 1\n")

    assert sources_compile(tmp_path) == 1

    assert not Path(importlib.util.cache_from_source(str(broken))).exists()
    assert Path(importlib.util.cache_from_source(str(good))).is_file()


def test_a_test_module_is_rewritten_where_a_test_process_reads_it(tmp_path, request):
    module = write(tmp_path / "test_sum.py", "def test_sum():\n    assert 1 + 1 == 3\n")

    assert modules_rewrite(request.config, [module]) == 0

    code = _read_pyc(module, rewritten_pyc(module))
    assert code is not None  # what pytest's import hook accepts instead of rewriting again
    namespace: dict = {}
    exec(code, namespace)
    with pytest.raises(AssertionError) as failure:
        namespace["test_sum"]()
    assert "assert (1 + 1) == 3" in str(failure.value)  # pytest's explanation, not a bare one


def test_a_rewritten_module_is_kept_while_its_source_is_unchanged_and_redone_after_an_edit(
    tmp_path, request
):
    module = write(tmp_path / "test_one.py", "def test_one():\n    assert True\n")
    modules_rewrite(request.config, [module])
    pyc = rewritten_pyc(module)
    first = pyc.stat().st_mtime_ns
    os.utime(pyc, ns=(first - 10**9, first - 10**9))

    modules_rewrite(request.config, [module])
    assert pyc.stat().st_mtime_ns == first - 10**9  # not written again

    module.write_text("def test_one():\n    assert 2 > 1\n")
    modules_rewrite(request.config, [module])
    assert pyc.stat().st_mtime_ns != first - 10**9
    assert _read_pyc(module, pyc) is not None


def test_a_module_that_cannot_be_rewritten_is_left_to_the_process_that_imports_it(
    tmp_path, request
):
    broken = write(tmp_path / "test_broken.py", "def test_(:\n")
    good = write(tmp_path / "test_good.py", "def test_good():\n    assert True\n")

    assert modules_rewrite(request.config, [broken, good]) == 1

    assert not rewritten_pyc(broken).exists()
    assert _read_pyc(good, rewritten_pyc(good)) is not None


def test_a_cache_directory_that_cannot_be_made_leaves_the_module_to_the_processes(
    tmp_path, request
):
    module = write(tmp_path / "test_here.py", "def test_here():\n    assert True\n")
    (tmp_path / "__pycache__").write_text("a file where the directory would be")

    assert modules_rewrite(request.config, [module]) == 1


def test_the_modules_rewritten_are_the_test_modules_under_the_runs_paths(request):
    config = request.config

    found = rewritable_modules(
        config,
        [
            "tests/model",
            "tests/test_readme.py::test_one",
            "tests/no_such_directory",
        ],
    )

    names = {path.relative_to(ROOT).as_posix() for path in found}
    assert names == {
        "tests/model/conftest.py",
        "tests/model/test_found_sequences.py",
        "tests/model/test_pipeline_model.py",
        "tests/test_readme.py",
    }


@pytest.mark.subprocess
def test_an_xdist_run_that_writes_no_bytecode_finds_its_modules_compiled_once(tmp_path):
    """A run as the suite's: the controller's thread writes the pycs though the processes may
    not (``PYTHONDONTWRITEBYTECODE``), and the rewritten asserts still explain a failure."""
    project = tmp_path / "project"
    write(project / "pytest.ini", "[pytest]\n")
    write(
        project / "conftest.py",
        """
        import pytest

        from tests.compile_ahead import compile_ahead_join, compile_ahead_start


        @pytest.hookimpl(optionalhook=True)
        def pytest_xdist_setupnodes(config, specs):
            compile_ahead_start(config)


        def pytest_unconfigure(config):
            compile_ahead_join(config)
        """,
    )
    write(project / "helper.py", "TWO = 2\n")
    write(
        project / "test_numbers.py",
        """
        from helper import TWO


        def test_passes():
            assert TWO == 2


        def test_fails():
            assert TWO + 1 == 4
        """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=f"{project}{os.pathsep}{ROOT}")

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-p", "no:django"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout
    assert "assert (2 + 1) == 4" in result.stdout
    assert _read_pyc(project / "test_numbers.py", rewritten_pyc(project / "test_numbers.py"))
    assert Path(importlib.util.cache_from_source(str(project / "helper.py"))).is_file()
