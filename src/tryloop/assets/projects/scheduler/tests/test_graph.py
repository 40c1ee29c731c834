import pytest
from scheduler import CycleError, DependencyGraph


def build(edges, extra=()):
    g = DependencyGraph()
    for t in extra:
        g.add_task(t)
    for task, dep in edges:
        g.add_dependency(task, dep)
    return g


def test_tasks_and_direct_dependencies():
    g = build([("b", "a"), ("c", "a"), ("c", "b")], extra=["z"])
    assert g.tasks() == ["a", "b", "c", "z"]
    assert g.dependencies("c") == {"a", "b"}
    assert g.dependencies("a") == set()
    assert g.dependents("a") == ["b", "c"]
    assert g.dependents("c") == []


def test_dependencies_returns_a_copy():
    g = build([("b", "a")])
    g.dependencies("b").add("x")
    assert g.dependencies("b") == {"a"}


def test_transitive_dependencies():
    g = build([("d", "c"), ("c", "b"), ("b", "a"), ("d", "x")])
    assert g.dependencies("d", transitive=True) == {"a", "b", "c", "x"}
    assert g.dependencies("d") == {"c", "x"}
    assert g.dependencies("b", transitive=True) == {"a"}
    assert g.dependencies("a", transitive=True) == set()


def test_topo_order_chain_and_diamond():
    assert build([("c", "b"), ("b", "a")]).topo_order() == ["a", "b", "c"]
    diamond = build([("top", "left"), ("top", "right"), ("left", "base"), ("right", "base")])
    assert diamond.topo_order() == ["base", "left", "right", "top"]


def test_topo_order_alphabetical_among_ready():
    g = build([("a", "z")], extra=["m", "b"])
    assert g.topo_order() == ["b", "m", "z", "a"]
    assert DependencyGraph().topo_order() == []


def test_topo_order_respects_every_edge():
    edges = [("app", "lib"), ("app", "cfg"), ("lib", "core"), ("cli", "app"), ("tests", "app"), ("lib", "cfg"),
             ("docs", "cli")]
    order = build(edges).topo_order()
    assert sorted(order) == sorted({t for e in edges for t in e})
    for task, dep in edges:
        assert order.index(dep) < order.index(task)
    assert order == ["cfg", "core", "lib", "app", "cli", "docs", "tests"]


def test_self_dependency_is_a_cycle():
    g = DependencyGraph()
    with pytest.raises(CycleError) as info:
        g.add_dependency("a", "a")
    assert info.value.cycle == ["a", "a"]


def test_find_cycle():
    assert build([("b", "a"), ("c", "b")]).find_cycle() is None
    g = build([("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])
    assert g.find_cycle() == ["a", "b", "c", "a"]
    g2 = build([("x", "y"), ("y", "z"), ("z", "y")])
    assert g2.find_cycle() == ["y", "z", "y"]
    g3 = build([("c", "x"), ("c", "y"), ("y", "c")])
    assert g3.find_cycle() == ["c", "y", "c"]


def test_topo_order_raises_with_cycle():
    g = build([("a", "b"), ("b", "c"), ("c", "a"), ("d", "e")])
    with pytest.raises(CycleError) as info:
        g.topo_order()
    assert info.value.cycle == ["a", "b", "c", "a"]
    assert "a -> b -> c -> a" in str(info.value)


def test_levels():
    g = build([("b", "a"), ("c", "a"), ("d", "b"), ("d", "c"), ("e", "a")], extra=["solo"])
    assert g.levels() == [["a", "solo"], ["b", "c", "e"], ["d"]]
    assert build([("c", "b"), ("b", "a"), ("c", "a")]).levels() == [["a"], ["b"], ["c"]]
    assert DependencyGraph().levels() == []
