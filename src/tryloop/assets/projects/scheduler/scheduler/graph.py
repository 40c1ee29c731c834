"""Tasks and the tasks they depend on."""

import heapq


class CycleError(ValueError):
    def __init__(self, cycle):
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


class DependencyGraph:
    """A directed graph: an edge task -> dep means `task` cannot start before `dep` is done."""

    def __init__(self):
        self.deps = {}

    def add_task(self, task):
        self.deps.setdefault(task, set())

    def add_dependency(self, task, dep):
        if task == dep:
            raise CycleError([task, task])
        self.add_task(task)
        self.add_task(dep)
        self.deps[task].add(dep)

    def tasks(self):
        return sorted(self.deps)

    def dependents(self, dep):
        """Tasks that depend directly on `dep`, sorted."""
        return sorted(t for t, ds in self.deps.items() if dep in ds)

    def dependencies(self, task, transitive=False):
        """Direct dependencies of `task`, or all of them (their dependencies too) if `transitive`."""
        if not transitive:
            return set(self.deps[task])
        seen = set()
        stack = list(self.deps[task])
        while stack:
            dep = stack.pop()
            if dep not in seen:
                seen.add(dep)
                stack.extend(self.deps[dep])
        return seen

    def find_cycle(self):
        """A cycle as a list of tasks whose first and last entries are the same, or None."""
        WHITE, GREY, BLACK = 0, 1, 2
        color = {t: WHITE for t in self.deps}
        path = []

        def visit(task):
            color[task] = GREY
            path.append(task)
            for dep in sorted(self.deps[task]):
                if color[dep] == GREY:
                    return path[path.index(dep):] + [dep]
                if color[dep] == WHITE:
                    found = visit(dep)
                    if found:
                        return found
            path.pop()
            color[task] = BLACK
            return None

        for task in sorted(self.deps):
            if color[task] == WHITE:
                found = visit(task)
                if found:
                    return found
        return None

    def topo_order(self):
        """Every task after all of its dependencies; among tasks ready together, alphabetical.
        Raises CycleError if there is no such order."""
        remaining = {t: len(ds) for t, ds in self.deps.items()}
        ready = [t for t, n in remaining.items() if n == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            task = heapq.heappop(ready)
            order.append(task)
            for child in self.dependents(task):
                remaining[child] -= 1
                if remaining[child] == 0:
                    heapq.heappush(ready, child)
        if len(order) != len(self.deps):
            raise CycleError(self.find_cycle())
        return order

    def levels(self):
        """Tasks grouped into batches that can run in parallel: batch k holds the tasks whose
        longest chain of dependencies has length k. Each batch is sorted."""
        depth = {}
        for task in self.topo_order():
            depth[task] = max((depth[d] + 1 for d in self.deps[task]), default=0)
        batches = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for task in sorted(depth):
            batches[depth[task]].append(task)
        return batches
