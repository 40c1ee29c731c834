import pytest
from scheduler import Calendar, Interval, free_slots, merge


def iv(a, b):
    return Interval(a, b)


def test_interval_basics():
    assert iv(10, 25).length == 15
    with pytest.raises(ValueError):
        iv(5, 5)
    with pytest.raises(ValueError):
        iv(6, 5)
    assert iv(0, 10).contains(iv(0, 10))
    assert iv(0, 10).contains(iv(2, 3))
    assert not iv(0, 10).contains(iv(5, 11))
    assert not iv(1, 10).contains(iv(0, 5))


def test_overlaps():
    assert iv(0, 10).overlaps(iv(5, 15))
    assert iv(5, 15).overlaps(iv(0, 10))
    assert iv(0, 10).overlaps(iv(2, 3))
    assert iv(2, 3).overlaps(iv(0, 10))
    assert not iv(0, 10).overlaps(iv(10, 20))
    assert not iv(10, 20).overlaps(iv(0, 10))
    assert not iv(0, 5).overlaps(iv(7, 9))


def test_merge():
    assert merge([]) == []
    assert merge([iv(5, 8), iv(1, 3)]) == [iv(1, 3), iv(5, 8)]
    assert merge([iv(1, 4), iv(2, 6), iv(8, 10)]) == [iv(1, 6), iv(8, 10)]
    assert merge([iv(1, 4), iv(4, 6)]) == [iv(1, 6)]
    assert merge([iv(1, 10), iv(2, 3), iv(4, 5)]) == [iv(1, 10)]
    assert merge([iv(6, 7), iv(1, 2), iv(2, 4), iv(3, 5)]) == [iv(1, 5), iv(6, 7)]


def test_free_slots():
    day = iv(540, 1020)  # 9:00 to 17:00
    assert free_slots([], day) == [day]
    assert free_slots([iv(600, 660)], day) == [iv(540, 600), iv(660, 1020)]
    assert free_slots([iv(500, 560), iv(1000, 1100)], day) == [iv(560, 1000)]
    assert free_slots([iv(540, 1020)], day) == []
    assert free_slots([iv(0, 100), iv(2000, 2100)], day) == [day]
    assert free_slots([iv(700, 720), iv(600, 650), iv(640, 660)], day) == [
        iv(540, 600), iv(660, 700), iv(720, 1020)]
    assert free_slots([iv(540, 600)], day) == [iv(600, 1020)]
    assert free_slots([iv(960, 1020)], day) == [iv(540, 960)]


def test_calendar_booking():
    cal = Calendar(iv(0, 100))
    cal.book("a", iv(10, 20))
    cal.book("b", iv(20, 30))
    with pytest.raises(ValueError):
        cal.book("c", iv(25, 35))
    with pytest.raises(ValueError):
        cal.book("d", iv(90, 110))
    assert cal.free() == [iv(0, 10), iv(30, 100)]
    cal.cancel("a")
    assert cal.free() == [iv(0, 20), iv(30, 100)]
    assert "c" not in cal.bookings


def test_first_fit():
    cal = Calendar(iv(0, 100))
    cal.book("a", iv(10, 20))
    cal.book("b", iv(35, 50))
    assert cal.first_fit(10) == 0
    assert cal.first_fit(11) == 20
    assert cal.first_fit(15) == 20
    assert cal.first_fit(16) == 50
    assert cal.first_fit(50) == 50
    assert cal.first_fit(51) is None
    assert cal.first_fit(5, earliest=8) == 20
    assert cal.first_fit(5, earliest=22) == 22
    assert cal.first_fit(5, earliest=-50) == 0
    assert cal.first_fit(5, earliest=97) is None


def test_utilisation():
    cal = Calendar(iv(0, 200))
    assert cal.utilisation() == 0
    cal.book("a", iv(0, 50))
    cal.book("b", iv(100, 150))
    assert cal.utilisation() == 0.5
