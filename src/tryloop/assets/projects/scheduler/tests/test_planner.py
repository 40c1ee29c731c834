import pytest
from scheduler import Calendar, CycleError, Interval, Job, PlanError, plan


def test_plan_respects_dependencies():
    jobs = [Job("deploy", 10, after=("build", "test")), Job("build", 30), Job("test", 20, after=("build",))]
    cal = Calendar(Interval(0, 480))
    placed = plan(jobs, cal)
    assert placed == {"build": Interval(0, 30), "test": Interval(30, 50), "deploy": Interval(50, 60)}
    assert cal.bookings == placed


def test_plan_priority_then_name():
    jobs = [Job("c", 10, priority=1), Job("b", 10, priority=0), Job("a", 10, priority=1)]
    placed = plan(jobs, Calendar(Interval(0, 100)))
    assert placed["b"] == Interval(0, 10)
    assert placed["a"] == Interval(10, 20)
    assert placed["c"] == Interval(20, 30)
    default_first = plan([Job("b", 5, priority=0), Job("a", 5)], Calendar(Interval(0, 100)))
    assert default_first == {"a": Interval(0, 5), "b": Interval(5, 10)}


def test_plan_unblocked_jobs_join_the_queue():
    jobs = [Job("urgent", 5, priority=-1, after=("first",)), Job("first", 10, priority=5), Job("other", 10)]
    placed = plan(jobs, Calendar(Interval(0, 100)))
    assert placed["other"] == Interval(0, 10)
    assert placed["first"] == Interval(10, 20)
    assert placed["urgent"] == Interval(20, 25)


def test_plan_fills_gaps_around_meetings():
    cal = Calendar(Interval(540, 720))
    cal.book("standup", Interval(570, 585))
    cal.book("lunch", Interval(660, 720))
    jobs = [Job("email", 20), Job("review", 45, priority=-1), Job("notes", 10, after=("review",))]
    placed = plan(jobs, cal)
    assert placed["review"] == Interval(585, 630)
    assert placed["email"] == Interval(540, 560)
    assert placed["notes"] == Interval(630, 640)


def test_dependency_waits_even_if_earlier_gap_exists():
    cal = Calendar(Interval(0, 100))
    cal.book("meeting", Interval(10, 40))
    jobs = [Job("long", 8), Job("short", 5, after=("long",))]
    placed = plan(jobs, cal)
    assert placed["long"] == Interval(0, 8)
    assert placed["short"] == Interval(40, 45)


def test_plan_errors():
    with pytest.raises(PlanError):
        plan([Job("a", 10, after=("ghost",))], Calendar(Interval(0, 100)))
    with pytest.raises(CycleError):
        plan([Job("a", 10, after=("b",)), Job("b", 10, after=("a",))], Calendar(Interval(0, 100)))
    with pytest.raises(PlanError) as info:
        plan([Job("a", 60), Job("b", 60)], Calendar(Interval(0, 100)))
    assert "b" in str(info.value)


def test_plan_exact_fit_and_empty():
    cal = Calendar(Interval(0, 60))
    placed = plan([Job("x", 30), Job("y", 30, after=("x",))], cal)
    assert placed["y"] == Interval(30, 60)
    assert cal.utilisation() == 1.0
    assert plan([], Calendar(Interval(0, 10))) == {}
