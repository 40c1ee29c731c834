from decimal import Decimal

import pytest
from inventory import Inventory, LineItem, Order, OutOfStock, Product

PEN = Product("PEN-0001", "Pen", Decimal("1.50"), "office")
BOOK = Product("BOO-0001", "Book", Decimal("12.00"), "books", taxable=False)
MUG = Product("MUG-0001", "Mug", Decimal("8.25"), "kitchen")


def make_inventory():
    inv = Inventory()
    inv.add_product(PEN, 10)
    inv.add_product(BOOK, 3)
    inv.add_product(MUG, 0)
    return inv


def test_line_item_subtotal():
    assert LineItem(PEN, 4).subtotal == Decimal("6.00")
    assert LineItem(MUG, 1).subtotal == Decimal("8.25")
    assert LineItem(BOOK, 0).subtotal == 0


def test_order_add_merges_same_sku():
    order = Order("o1")
    order.add(PEN, 2)
    order.add(BOOK)
    order.add(PEN, 3)
    assert len(order.items) == 2
    assert order.quantity_of("PEN-0001") == 5
    assert order.quantity_of("BOO-0001") == 1
    assert order.quantity_of("MUG-0001") == 0
    assert order.total_quantity() == 6
    assert [i.product.sku for i in order.items] == ["PEN-0001", "BOO-0001"]


def test_order_add_rejects_bad_quantity():
    order = Order("o1")
    with pytest.raises(ValueError):
        order.add(PEN, 0)
    with pytest.raises(ValueError):
        order.add(PEN, -2)
    assert order.is_empty()


def test_order_subtotal():
    order = Order("o1")
    assert order.subtotal() == 0
    order.add(PEN, 4)
    order.add(BOOK, 2)
    order.add(MUG, 1)
    assert order.subtotal() == Decimal("38.25")


def test_order_remove():
    order = Order("o1")
    order.add(PEN, 5)
    order.add(MUG, 2)
    order.remove("PEN-0001", 2)
    assert order.quantity_of("PEN-0001") == 3
    order.remove("PEN-0001", 3)
    assert order.find("PEN-0001") is None
    order.remove("MUG-0001")
    assert order.is_empty()
    with pytest.raises(KeyError):
        order.remove("MUG-0001")


def test_order_remove_more_than_present_removes_line():
    order = Order("o1")
    order.add(PEN, 2)
    order.add(MUG, 1)
    order.remove("PEN-0001", 9)
    assert order.find("PEN-0001") is None
    assert order.total_quantity() == 1


def test_find():
    order = Order("o1")
    order.add(PEN, 1)
    order.add(MUG, 1)
    assert order.find("MUG-0001").product is MUG
    assert order.find("PEN-0001").product is PEN
    assert order.find("BOO-0001") is None


def test_inventory_add_and_restock():
    inv = make_inventory()
    assert inv.available("PEN-0001") == 10
    assert inv.available("MUG-0001") == 0
    assert inv.available("NOP-0000") == 0
    inv.restock("MUG-0001", 4)
    inv.restock("MUG-0001", 1)
    assert inv.available("MUG-0001") == 5
    with pytest.raises(ValueError):
        inv.add_product(PEN, 1)
    inv.add_product(Product("NEW-0001", "New", Decimal("2.00")))
    assert inv.available("NEW-0001") == 0
    with pytest.raises(KeyError):
        inv.restock("NOP-0000", 1)
    with pytest.raises(ValueError):
        inv.restock("PEN-0001", 0)


def test_reserve_and_release():
    inv = make_inventory()
    order = Order("o1")
    order.add(PEN, 4)
    order.add(BOOK, 3)
    inv.reserve(order)
    assert inv.available("PEN-0001") == 6
    assert inv.available("BOO-0001") == 0
    assert inv.on_hand["PEN-0001"] == 10
    inv.release(order)
    assert inv.available("PEN-0001") == 10
    assert inv.available("BOO-0001") == 3
    inv.release(order)
    assert inv.reserved["PEN-0001"] == 0


def test_reserve_is_all_or_nothing():
    inv = make_inventory()
    order = Order("o1")
    order.add(PEN, 2)
    order.add(BOOK, 4)
    with pytest.raises(OutOfStock) as info:
        inv.reserve(order)
    assert info.value.sku == "BOO-0001"
    assert info.value.wanted == 4
    assert info.value.available == 3
    assert str(info.value) == "BOO-0001: wanted 4, only 3 available"
    assert inv.available("PEN-0001") == 10


def test_reserve_exact_stock():
    inv = make_inventory()
    order = Order("o1")
    order.add(BOOK, 3)
    inv.reserve(order)
    assert inv.available("BOO-0001") == 0
    again = Order("o2")
    again.add(BOOK, 1)
    with pytest.raises(OutOfStock):
        inv.reserve(again)


def test_ship():
    inv = make_inventory()
    order = Order("o1")
    order.add(PEN, 4)
    inv.reserve(order)
    inv.ship(order)
    assert inv.on_hand["PEN-0001"] == 6
    assert inv.reserved["PEN-0001"] == 0
    assert inv.available("PEN-0001") == 6
    with pytest.raises(ValueError):
        inv.ship(order)
    assert inv.on_hand["PEN-0001"] == 6


def test_low_stock():
    inv = make_inventory()
    assert inv.low_stock(4) == ["BOO-0001", "MUG-0001"]
    assert inv.low_stock(3) == ["MUG-0001"]
    assert inv.low_stock(0) == []
    order = Order("o1")
    order.add(PEN, 8)
    inv.reserve(order)
    assert inv.low_stock(4) == ["BOO-0001", "MUG-0001", "PEN-0001"]


def test_stock_value():
    inv = make_inventory()
    assert inv.stock_value() == Decimal("51.00")
    inv.restock("MUG-0001", 2)
    assert inv.stock_value() == Decimal("67.50")
    assert Inventory().stock_value() == 0
