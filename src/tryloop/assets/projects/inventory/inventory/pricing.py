"""Discounts, tax and the final price of an order."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from inventory.models import Order

CENT = Decimal("0.01")


def money(value) -> Decimal:
    """Round to whole cents, halves away from zero."""
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class PercentOff:
    """`percent` off (10 means 10 %), on one category only if `category` is set."""

    percent: Decimal
    category: str | None = None

    def amount(self, order: Order) -> Decimal:
        base = sum((item.subtotal for item in order.items
                    if self.category is None or item.product.category == self.category), Decimal("0"))
        return base * Decimal(self.percent) / 100


@dataclass(frozen=True)
class FixedOff:
    """A fixed amount off orders whose subtotal reaches `min_subtotal`."""

    value: Decimal
    min_subtotal: Decimal = Decimal("0")

    def amount(self, order: Order) -> Decimal:
        subtotal = order.subtotal()
        if subtotal < self.min_subtotal:
            return Decimal("0")
        return min(Decimal(self.value), subtotal)


@dataclass(frozen=True)
class BuyXGetY:
    """For every `buy` units of `sku` bought, `free` more of them cost nothing."""

    sku: str
    buy: int
    free: int

    def amount(self, order: Order) -> Decimal:
        item = order.find(self.sku)
        if item is None:
            return Decimal("0")
        group = self.buy + self.free
        free_units = (item.quantity // group) * self.free
        return item.product.price * free_units


def parse_coupon(code: str):
    """'PCT10' -> 10 % off, 'PCT15:books' -> 15 % off books, 'OFF5' -> 5 off, 'OFF20@100' -> 20 off from 100."""
    code = code.strip().upper()
    if code.startswith("PCT"):
        body, _, category = code[3:].partition(":")
        return PercentOff(Decimal(body), category.lower() or None)
    if code.startswith("OFF"):
        body, _, minimum = code[3:].partition("@")
        return FixedOff(Decimal(body), Decimal(minimum or "0"))
    raise ValueError(f"unknown coupon {code!r}")


@dataclass(frozen=True)
class Quote:
    subtotal: Decimal
    discount: Decimal
    tax: Decimal
    total: Decimal


def price_order(order: Order, discounts=(), tax_rate=Decimal("0.08"), stack=False) -> Quote:
    """Price `order`: the best single discount (or all of them if `stack`), then tax on taxable goods.

    The discount is shared between taxable and untaxed goods in proportion to their subtotals,
    and can never exceed the subtotal.
    """
    subtotal = order.subtotal()
    amounts = [d.amount(order) for d in discounts]
    if not amounts:
        discount = Decimal("0")
    elif stack:
        discount = sum(amounts, Decimal("0"))
    else:
        discount = max(amounts)
    discount = money(min(discount, subtotal))
    taxable = sum((item.subtotal for item in order.items if item.product.taxable), Decimal("0"))
    if subtotal > 0:
        taxable -= discount * taxable / subtotal
    tax = money(taxable * Decimal(tax_rate))
    total = money(subtotal - discount + tax)
    return Quote(money(subtotal), discount, tax, total)
