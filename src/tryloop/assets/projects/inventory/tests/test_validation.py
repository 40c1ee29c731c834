from decimal import Decimal

import pytest
from inventory import (
    Inventory,
    Order,
    Product,
    ValidationError,
    check_order,
    validate_quantity,
    validate_sku,
)
from inventory.validation import MAX_QUANTITY

PEN = Product("PEN-0001", "Pen", Decimal("1.50"), "office")
MUG = Product("MUG-0001", "Mug", Decimal("8.25"), "kitchen")


def test_validate_sku_accepts_and_normalises():
    assert validate_sku("ABC-1234") == "ABC-1234"
    assert validate_sku(" abc-1234 ") == "ABC-1234"


def test_validate_sku_rejects():
    for bad in ["AB-1234", "ABCD-1234", "ABC-123", "ABC-12345", "ABC1234", "A1C-1234", "", "ABC-12a4"]:
        with pytest.raises(ValidationError):
            validate_sku(bad)
    with pytest.raises(ValidationError):
        validate_sku(1234)
    with pytest.raises(ValueError):
        validate_sku(None)


def test_validate_quantity():
    assert validate_quantity(1) == 1
    assert validate_quantity(1000) == 1000
    assert MAX_QUANTITY == 1000
    for bad in [0, -1, 1001, True, 1.0, "3", None]:
        with pytest.raises(ValidationError):
            validate_quantity(bad)


def test_check_order_ok():
    inv = Inventory()
    inv.add_product(PEN, 5)
    order = Order("o1")
    order.add(PEN, 5)
    assert check_order(order, inv) == []


def test_check_order_reports_every_problem():
    inv = Inventory()
    inv.add_product(PEN, 5)
    inv.add_product(MUG, 1)
    order = Order("o1")
    order.add(PEN, 6)
    order.add(MUG, 1)
    order.add(Product("BAD", "Thing", Decimal("1")), 1)
    order.add(Product("NEW-0001", "New", Decimal("1")), 1)
    assert check_order(order, inv) == ["PEN-0001: only 5 available", "bad sku 'BAD'", "unknown sku NEW-0001"]


def test_check_order_empty_and_quantity_limits():
    inv = Inventory()
    inv.add_product(PEN, 5000)
    assert check_order(Order("e"), inv) == ["order is empty"]
    order = Order("big")
    order.add(PEN, 1001)
    assert check_order(order, inv) == ["PEN-0001: quantity must be at most 1000"]
    short = Inventory()
    short.add_product(PEN, 5)
    assert check_order(order, short) == ["PEN-0001: quantity must be at most 1000"]


def test_check_order_counts_reservations():
    inv = Inventory()
    inv.add_product(PEN, 5)
    first = Order("o1")
    first.add(PEN, 3)
    inv.reserve(first)
    second = Order("o2")
    second.add(PEN, 3)
    assert check_order(second, inv) == ["PEN-0001: only 2 available"]
    inv.release(first)
    assert check_order(second, inv) == []
