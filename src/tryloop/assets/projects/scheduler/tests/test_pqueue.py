import pytest
from scheduler import PriorityQueue


def test_pop_lowest_first():
    q = PriorityQueue()
    q.push("c", 3)
    q.push("a", 1)
    q.push("b", 2)
    assert len(q) == 3
    assert q.pop() == ("a", 1)
    assert q.pop() == ("b", 2)
    assert q.pop() == ("c", 3)
    assert len(q) == 0


def test_equal_priorities_fifo():
    q = PriorityQueue()
    for item in ["x", "y", "z", "w"]:
        q.push(item, 5)
    q.push("first", 1)
    assert q.drain() == ["first", "x", "y", "z", "w"]


def test_peek_does_not_remove():
    q = PriorityQueue()
    q.push("a", 2)
    q.push("b", 1)
    assert q.peek() == ("b", 1)
    assert q.peek() == ("b", 1)
    assert len(q) == 2
    assert "b" in q


def test_update_priority():
    q = PriorityQueue()
    q.push("a", 1)
    q.push("b", 2)
    q.push("c", 3)
    q.push("c", 0)
    assert len(q) == 3
    assert q.priority("c") == 0
    q.push("a", 9)
    assert q.drain() == ["c", "b", "a"]


def test_repush_same_priority_goes_to_back():
    q = PriorityQueue()
    q.push("a", 1)
    q.push("b", 1)
    q.push("a", 1)
    assert q.drain() == ["b", "a"]


def test_remove():
    q = PriorityQueue()
    q.push("a", 1)
    q.push("b", 2)
    q.remove("a")
    assert "a" not in q
    assert len(q) == 1
    assert q.peek() == ("b", 2)
    assert q.pop() == ("b", 2)
    with pytest.raises(KeyError):
        q.remove("a")


def test_empty_queue_errors():
    q = PriorityQueue()
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(IndexError):
        q.peek()
    q.push("a", 1)
    q.remove("a")
    with pytest.raises(IndexError):
        q.pop()
    assert q.drain() == []


def test_tuple_priorities():
    q = PriorityQueue()
    q.push("late", (2, "a"))
    q.push("b", (1, "b"))
    q.push("a", (1, "a"))
    assert q.drain() == ["a", "b", "late"]
