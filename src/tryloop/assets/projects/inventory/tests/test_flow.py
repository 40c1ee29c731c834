from decimal import Decimal

from inventory import Inventory, Order, Product, check_order, parse_coupon, price_order

CATALOG = [
    Product("PEN-0001", "Pen", Decimal("1.50"), "office"),
    Product("BOO-0001", "Book", Decimal("12.00"), "books", taxable=False),
    Product("MUG-0001", "Mug", Decimal("8.25"), "kitchen"),
]


def test_checkout_flow():
    inv = Inventory()
    for product, qty in zip(CATALOG, [10, 3, 2], strict=True):
        inv.add_product(product, qty)
    order = Order("o1")
    order.add(inv.products["PEN-0001"], 4)
    order.add(inv.products["BOO-0001"], 2)
    order.add(inv.products["MUG-0001"], 1)
    assert check_order(order, inv) == []
    quote = price_order(order, [parse_coupon("PCT10")])
    assert quote.total == Decimal("35.45")
    inv.reserve(order)
    inv.ship(order)
    assert [inv.on_hand[p.sku] for p in CATALOG] == [6, 1, 1]
    assert inv.low_stock(2) == ["BOO-0001", "MUG-0001"]


def test_coupon_for_category_in_checkout():
    order = Order("o2")
    order.add(CATALOG[1], 2)
    order.add(CATALOG[0], 2)
    quote = price_order(order, [parse_coupon("PCT25:books"), parse_coupon("OFF5@20")])
    assert quote.discount == Decimal("6.00")
    assert quote.subtotal == Decimal("27.00")
    assert quote.tax == Decimal("0.19")
    assert quote.total == Decimal("21.19")
