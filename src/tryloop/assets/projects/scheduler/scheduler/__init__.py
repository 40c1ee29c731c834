"""Dependency graphs, priority queues, calendars and a planner that puts them together."""

from scheduler.graph import CycleError, DependencyGraph
from scheduler.planner import Job, PlanError, plan
from scheduler.pqueue import PriorityQueue
from scheduler.slots import Calendar, Interval, free_slots, merge

__all__ = [
    "Calendar", "CycleError", "DependencyGraph", "Interval", "Job", "PlanError", "PriorityQueue", "free_slots",
    "merge", "plan",
]
