import pytest

from bank.nacha import layouts as L
from bank.nacha.routing import check_digit, is_routing_number, routing_number_problem


@pytest.mark.parametrize("layout", L.ALL_LAYOUTS, ids=lambda layout: layout.name)
def test_every_layout_covers_columns_1_to_94_without_gap_or_overlap(layout):
    columns = [c for f in layout.fields for c in range(f.start, f.end + 1)]
    assert columns == list(range(1, 95))


def test_a_layout_with_a_gap_is_refused_at_import():
    broken = L.Layout("broken", (L.Field("a", 1, 10), L.Field("b", 12, 94)))
    with pytest.raises(AssertionError, match="b starts at 12"):
        L._check(broken)


@pytest.mark.parametrize(
    ("code", "layout"),
    [
        ("R01", L.ADDENDA_99),
        ("R61", L.ADDENDA_99_DISHONORED),
        ("R69", L.ADDENDA_99_DISHONORED),
        ("R70", L.ADDENDA_99),
        ("R71", L.ADDENDA_99_CONTESTED),
        ("R77", L.ADDENDA_99_CONTESTED),
        ("R78", L.ADDENDA_99),
    ],
)
def test_a_return_code_picks_its_layout(code, layout):
    assert L.addenda_99_layout(code) is layout


def test_a_refused_noc_code_picks_the_refused_layout():
    assert L.addenda_98_layout("C61") is L.ADDENDA_98_REFUSED
    assert L.addenda_98_layout("C01") is L.ADDENDA_98


@pytest.mark.parametrize("routing", ["011000015", "021000021", "121042882", "231380104"])
def test_real_routing_numbers_pass_the_check_digit(routing):
    assert is_routing_number(routing)
    assert check_digit(routing[:8]) == int(routing[8])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("021000022", "check digit"),
        ("02100002", "9 digits"),
        ("0210000211", "9 digits"),
        ("02100002a", "9 digits"),
        ("٠٢١٠٠٠٠٢١", "9 digits"),
        ("501000015", "starts"),
    ],
)
def test_a_wrong_routing_number_is_refused_without_repeating_it(value, problem):
    message = routing_number_problem(value)
    assert problem in message
    assert value not in message
