from mathkit import binary_search, insertion_point


def test_binary_search_found():
    items = [1, 3, 5, 7, 9, 11]
    for i, x in enumerate(items):
        assert binary_search(items, x) == i


def test_binary_search_missing():
    items = [1, 3, 5, 7, 9, 11]
    assert binary_search(items, 0) == -1
    assert binary_search(items, 4) == -1
    assert binary_search(items, 12) == -1
    assert binary_search([], 1) == -1
    assert binary_search([5], 5) == 0
    assert binary_search([5], 6) == -1


def test_binary_search_two_elements():
    assert binary_search([2, 4], 2) == 0
    assert binary_search([2, 4], 4) == 1
    assert binary_search([2, 4], 3) == -1


def test_insertion_point():
    items = [10, 20, 20, 30]
    assert insertion_point(items, 5) == 0
    assert insertion_point(items, 10) == 0
    assert insertion_point(items, 15) == 1
    assert insertion_point(items, 20) == 1
    assert insertion_point(items, 25) == 3
    assert insertion_point(items, 30) == 3
    assert insertion_point(items, 35) == 4
    assert insertion_point([], 1) == 0
