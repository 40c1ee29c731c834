from calc.ops import clamp, mean


def test_mean_rounding():
    assert abs(mean([1, 1, 2]) - 4 / 3) < 1e-9
    assert mean([10, 15]) == 12.5


def test_clamp_rejects_inverted_bounds():
    import pytest

    with pytest.raises(ValueError, match="lo must not exceed hi"):
        clamp(1, 3, 0)
