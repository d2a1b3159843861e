"""The order pytest-xdist hands the tests out in (tests/conftest.py): the longest first."""

import types
from pathlib import Path

from tests.conftest import LONGEST_FIRST, _slow_modules_first

ROOT = Path(__file__).resolve().parents[1]


def item(nodeid: str, *markers: str):
    return types.SimpleNamespace(
        nodeid=nodeid, get_closest_marker=lambda name: name if name in markers else None
    )


def test_every_module_named_longest_first_is_a_test_module_of_the_suite():
    missing = [name for name in LONGEST_FIRST if not (ROOT / name).is_file()]

    assert not missing, f"LONGEST_FIRST names modules that are gone: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_longest_go_first_in_their_order_then_the_process_tiers_then_the_rest_by_size():
    longest, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    items = [
        item("tests/a/test_big.py::test_1"),
        item("tests/a/test_big.py::test_2"),
        item("tests/a/test_small.py::test_1"),
        item("tests/a/test_procs.py::test_fast"),
        item("tests/a/test_procs.py::test_starts_a_worker", "subprocess"),
        item(f"{second}::test_1"),
        item(f"{longest}::test_1"),
    ]

    _slow_modules_first(items)

    assert [i.nodeid for i in items] == [
        f"{longest}::test_1",
        f"{second}::test_1",
        "tests/a/test_procs.py::test_fast",
        "tests/a/test_procs.py::test_starts_a_worker",
        "tests/a/test_big.py::test_1",
        "tests/a/test_big.py::test_2",
        "tests/a/test_small.py::test_1",
    ]
