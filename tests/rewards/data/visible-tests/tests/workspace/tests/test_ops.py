import pytest
from calc.ops import add, clamp, mean


def test_add():
    assert add(2, 3) == 5
    assert add(-1.5, 1.5) == 0


def test_mean_of_integers():
    assert mean([2, 4, 6]) == 4


def test_mean_of_empty_raises():
    with pytest.raises(ValueError):
        mean([])


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-2, 0, 3) == 0


def test_mean_of_fractions():
    assert mean([1, 2]) == 1.5
    assert mean([0.125, 0.25, 0.375]) == 0.25
    assert mean([1234.5, 2345.5]) == 1790.0
