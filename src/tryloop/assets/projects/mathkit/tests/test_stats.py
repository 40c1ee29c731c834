import pytest
from mathkit import mean, median, mode, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([5]) == 5
    assert mean([-1, 1]) == 0
    assert mean([2, 2, 2, 8]) == 3.5
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2
    assert median([7]) == 7
    assert median([9, 1, 5, 3, 7]) == 5


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5
    assert median([1, 10]) == 5.5
    assert median([5, 5, 6, 8]) == 5.5
    with pytest.raises(ValueError):
        median([])


def test_median_does_not_modify_input():
    data = [3, 1, 2]
    median(data)
    assert data == [3, 1, 2]


def test_mode():
    assert mode([1, 2, 2, 3]) == 2
    assert mode([4, 4, 1, 1, 2]) == 1
    assert mode([7]) == 7
    assert mode([3, 1, 3, 1, 3]) == 3
    assert mode(["b", "a", "b"]) == "b"
    assert mode([5, 9, 9, 5, 1]) == 5
    with pytest.raises(ValueError):
        mode([])


def test_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
    assert variance([1, 1, 1]) == 0
    assert variance([1, 2, 3, 4], sample=True) == pytest.approx(5 / 3)
    assert variance([1, 2, 3, 4]) == pytest.approx(1.25)
    assert variance([5]) == 0
    assert variance([1, 3], sample=True) == 2
    with pytest.raises(ValueError):
        variance([])
    with pytest.raises(ValueError):
        variance([5], sample=True)
