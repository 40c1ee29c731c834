import pytest
from units.convert import to_celsius, to_minutes


# Expected values as data: a parametrization and a module-level table.
@pytest.mark.parametrize("fahrenheit, celsius", [(32, 0.0), (212, 100.0), (-40, -40.0), (98.6, 37.0)])
def test_to_celsius(fahrenheit, celsius):
    assert round(to_celsius(fahrenheit), 6) == celsius


FREEZING = [(50, 10.0), (14, -10.0), (59, 15.0)]


def test_to_celsius_table():
    for fahrenheit, celsius in FREEZING:
        assert round(to_celsius(fahrenheit), 6) == celsius


@pytest.mark.parametrize("text, minutes", [("0:05", 5), ("1:30", 90), ("12:00", 720)])
def test_to_minutes(text, minutes):
    assert to_minutes(text) == minutes
