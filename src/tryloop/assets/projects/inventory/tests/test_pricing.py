from decimal import Decimal

import pytest
from inventory import (
    BuyXGetY,
    FixedOff,
    Order,
    PercentOff,
    Product,
    Quote,
    money,
    parse_coupon,
    price_order,
)

PEN = Product("PEN-0001", "Pen", Decimal("1.50"), "office")
BOOK = Product("BOO-0001", "Book", Decimal("12.00"), "books", taxable=False)
MUG = Product("MUG-0001", "Mug", Decimal("8.25"), "kitchen")


def basket():
    order = Order("o1")
    order.add(PEN, 4)   # 6.00 taxable
    order.add(BOOK, 2)  # 24.00 untaxed
    order.add(MUG, 1)   # 8.25 taxable
    return order


def test_money_rounds_half_up():
    assert money("1.005") == Decimal("1.01")
    assert money("1.004") == Decimal("1.00")
    assert money("2.675") == Decimal("2.68")
    assert money("-1.005") == Decimal("-1.01")
    assert money(3) == Decimal("3.00")
    assert str(money("0.1")) == "0.10"


def test_percent_off():
    order = basket()
    assert PercentOff(Decimal("10")).amount(order) == Decimal("3.825")
    assert PercentOff(Decimal("50"), "books").amount(order) == Decimal("12")
    assert PercentOff(Decimal("20"), "garden").amount(order) == 0
    assert PercentOff(Decimal("100")).amount(order) == Decimal("38.25")


def test_fixed_off():
    order = basket()
    assert FixedOff(Decimal("5")).amount(order) == Decimal("5")
    assert FixedOff(Decimal("5"), Decimal("38.25")).amount(order) == Decimal("5")
    assert FixedOff(Decimal("5"), Decimal("38.26")).amount(order) == 0
    assert FixedOff(Decimal("100")).amount(order) == Decimal("38.25")


def test_buy_x_get_y():
    deal = BuyXGetY("PEN-0001", 3, 1)
    order = Order("o1")
    order.add(PEN, 3)
    assert deal.amount(order) == 0
    order.add(PEN, 1)
    assert deal.amount(order) == Decimal("1.50")
    order.add(PEN, 3)
    assert deal.amount(order) == Decimal("1.50")
    order.add(PEN, 1)
    assert deal.amount(order) == Decimal("3.00")
    assert BuyXGetY("MUG-0001", 1, 1).amount(order) == 0
    two_for_one = Order("o2")
    two_for_one.add(MUG, 5)
    assert BuyXGetY("MUG-0001", 1, 1).amount(two_for_one) == Decimal("16.50")
    assert BuyXGetY("MUG-0001", 2, 3).amount(two_for_one) == Decimal("24.75")


def test_parse_coupon():
    assert parse_coupon("PCT10") == PercentOff(Decimal("10"), None)
    assert parse_coupon(" pct15:Books ") == PercentOff(Decimal("15"), "books")
    assert parse_coupon("OFF5") == FixedOff(Decimal("5"), Decimal("0"))
    assert parse_coupon("off20@100") == FixedOff(Decimal("20"), Decimal("100"))
    with pytest.raises(ValueError):
        parse_coupon("FREE")


def test_price_without_discount():
    quote = price_order(basket())
    assert quote == Quote(Decimal("38.25"), Decimal("0.00"), Decimal("1.14"), Decimal("39.39"))


def test_price_with_percent_discount():
    quote = price_order(basket(), [PercentOff(Decimal("10"))])
    assert quote.subtotal == Decimal("38.25")
    assert quote.discount == Decimal("3.83")
    assert quote.tax == Decimal("1.03")
    assert quote.total == Decimal("35.45")


def test_best_single_discount_wins():
    discounts = [PercentOff(Decimal("15"), "books"), FixedOff(Decimal("5"), Decimal("30"))]
    quote = price_order(basket(), discounts)
    assert quote.discount == Decimal("5.00")
    assert quote.total == Decimal("34.24")
    flipped = price_order(basket(), list(reversed(discounts)))
    assert flipped == quote


def test_stacked_discounts():
    discounts = [PercentOff(Decimal("15"), "books"), FixedOff(Decimal("5"), Decimal("30"))]
    quote = price_order(basket(), discounts, stack=True)
    assert quote.discount == Decimal("8.60")
    assert quote.tax == Decimal("0.88")
    assert quote.total == Decimal("30.53")


def test_discount_never_exceeds_subtotal():
    quote = price_order(basket(), [FixedOff(Decimal("30")), PercentOff(Decimal("90"))], stack=True)
    assert quote.discount == Decimal("38.25")
    assert quote.tax == Decimal("0.00")
    assert quote.total == Decimal("0.00")


def test_tax_rate_and_untaxed_goods():
    only_books = Order("b")
    only_books.add(BOOK, 3)
    assert price_order(only_books).tax == 0
    assert price_order(only_books).total == Decimal("36.00")
    mugs = Order("m")
    mugs.add(MUG, 2)
    quote = price_order(mugs, tax_rate=Decimal("0.20"))
    assert quote.tax == Decimal("3.30")
    assert quote.total == Decimal("19.80")


def test_discount_share_on_small_orders():
    order = Order("s")
    order.add(Product("CLP-0001", "Clip", Decimal("0.50")), 1)
    quote = price_order(order, [FixedOff(Decimal("0.25"))])
    assert quote.discount == Decimal("0.25")
    assert quote.tax == Decimal("0.02")
    assert quote.total == Decimal("0.27")


def test_price_empty_order():
    assert price_order(Order("e"), [FixedOff(Decimal("5"))]) == Quote(Decimal("0.00"), Decimal("0.00"),
                                                                      Decimal("0.00"), Decimal("0.00"))
