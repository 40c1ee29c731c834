"""Time as half-open intervals [start, end) of whole minutes, and a calendar of bookings."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: int
    end: int

    def __post_init__(self):
        if self.end <= self.start:
            raise ValueError(f"empty interval [{self.start}, {self.end})")

    @property
    def length(self):
        return self.end - self.start

    def overlaps(self, other):
        """True if the two share at least one minute; touching intervals do not overlap."""
        return self.start < other.end and other.start < self.end

    def contains(self, other):
        return self.start <= other.start and other.end <= self.end


def merge(intervals):
    """Sorted, disjoint intervals covering the same minutes; touching intervals are joined."""
    result = []
    for iv in sorted(intervals):
        if result and iv.start <= result[-1].end:
            last = result[-1]
            result[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            result.append(iv)
    return result


def free_slots(busy, window):
    """The gaps inside `window` not covered by any of the `busy` intervals, in order."""
    gaps = []
    cursor = window.start
    for iv in merge(busy):
        if iv.end <= cursor:
            continue
        if iv.start >= window.end:
            break
        if iv.start > cursor:
            gaps.append(Interval(cursor, iv.start))
        cursor = max(cursor, iv.end)
    if cursor < window.end:
        gaps.append(Interval(cursor, window.end))
    return gaps


class Calendar:
    """Bookings inside a working window."""

    def __init__(self, window):
        self.window = window
        self.bookings = {}

    def book(self, name, interval):
        if not self.window.contains(interval):
            raise ValueError(f"{name}: {interval} is outside the window")
        for other, booked in self.bookings.items():
            if booked.overlaps(interval):
                raise ValueError(f"{name}: {interval} clashes with {other}")
        self.bookings[name] = interval

    def cancel(self, name):
        del self.bookings[name]

    def free(self):
        return free_slots(list(self.bookings.values()), self.window)

    def first_fit(self, duration, earliest=None):
        """The earliest start >= `earliest` at which `duration` free minutes begin, or None."""
        start_at = self.window.start if earliest is None else max(earliest, self.window.start)
        for gap in self.free():
            start = max(gap.start, start_at)
            if gap.end - start >= duration:
                return start
        return None

    def utilisation(self):
        """Share of the window that is booked."""
        booked = sum(iv.length for iv in merge(self.bookings.values()))
        return booked / self.window.length
