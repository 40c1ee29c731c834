"""Planning jobs into a calendar: dependencies first, then priority, then the earliest free slot."""

from dataclasses import dataclass

from scheduler.graph import DependencyGraph
from scheduler.pqueue import PriorityQueue
from scheduler.slots import Calendar, Interval


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class Job:
    name: str
    duration: int
    priority: int = 0
    after: tuple = ()


def plan(jobs, calendar: Calendar):
    """Book every job in `calendar` and return {name: Interval}.

    A job starts only after all of the jobs in its `after` have ended. Among the jobs whose
    dependencies are planned, the lowest `priority` value goes first (then the name); each
    takes the earliest free slot that is long enough. Raises PlanError for unknown
    dependencies, cycles (CycleError) or when a job does not fit.
    """
    by_name = {job.name: job for job in jobs}
    graph = DependencyGraph()
    for job in jobs:
        graph.add_task(job.name)
        for dep in job.after:
            if dep not in by_name:
                raise PlanError(f"{job.name} depends on unknown job {dep}")
            graph.add_dependency(job.name, dep)
    graph.topo_order()  # raises CycleError early

    waiting = {name: len(graph.dependencies(name)) for name in by_name}
    ready = PriorityQueue()
    for name in sorted(by_name):
        if waiting[name] == 0:
            ready.push(name, (by_name[name].priority, name))
    placed = {}
    while ready:
        name, _ = ready.pop()
        job = by_name[name]
        earliest = max((placed[d].end for d in job.after), default=None)
        start = calendar.first_fit(job.duration, earliest)
        if start is None:
            raise PlanError(f"no room for {name} ({job.duration} min)")
        slot = Interval(start, start + job.duration)
        calendar.book(name, slot)
        placed[name] = slot
        for child in graph.dependents(name):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.push(child, (by_name[child].priority, child))
    return placed
