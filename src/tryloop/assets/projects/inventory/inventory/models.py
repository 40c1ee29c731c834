"""Products, orders and the stock they draw on."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal


class OutOfStock(Exception):
    """Raised when an order asks for more than the inventory has available."""

    def __init__(self, sku, wanted, available):
        super().__init__(f"{sku}: wanted {wanted}, only {available} available")
        self.sku = sku
        self.wanted = wanted
        self.available = available


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: Decimal
    category: str = "general"
    taxable: bool = True


@dataclass
class LineItem:
    product: Product
    quantity: int

    @property
    def subtotal(self) -> Decimal:
        return self.product.price * self.quantity


@dataclass
class Order:
    order_id: str
    items: list[LineItem] = field(default_factory=list)

    def add(self, product: Product, quantity: int = 1) -> None:
        """Add `quantity` of `product`; a product already in the order has its quantity raised."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        for item in self.items:
            if item.product.sku == product.sku:
                item.quantity += quantity
                return
        self.items.append(LineItem(product, quantity))

    def remove(self, sku: str, quantity: int | None = None) -> None:
        """Remove `quantity` units of `sku` (all of them when None). KeyError if absent."""
        item = self.find(sku)
        if item is None:
            raise KeyError(sku)
        if quantity is None or quantity >= item.quantity:
            self.items.remove(item)
        else:
            item.quantity -= quantity

    def find(self, sku: str) -> LineItem | None:
        for item in self.items:
            if item.product.sku == sku:
                return item
        return None

    def quantity_of(self, sku: str) -> int:
        item = self.find(sku)
        return item.quantity if item else 0

    def total_quantity(self) -> int:
        return sum(item.quantity for item in self.items)

    def subtotal(self) -> Decimal:
        return sum((item.subtotal for item in self.items), Decimal("0"))

    def is_empty(self) -> bool:
        return not self.items


class Inventory:
    """Stock on hand, with reservations held for orders that are not shipped yet."""

    def __init__(self):
        self.products: dict[str, Product] = {}
        self.on_hand: dict[str, int] = {}
        self.reserved: dict[str, int] = {}

    def add_product(self, product: Product, quantity: int = 0) -> None:
        if product.sku in self.products:
            raise ValueError(f"duplicate sku {product.sku}")
        self.products[product.sku] = product
        self.on_hand[product.sku] = quantity
        self.reserved[product.sku] = 0

    def restock(self, sku: str, quantity: int) -> None:
        if sku not in self.products:
            raise KeyError(sku)
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.on_hand[sku] += quantity

    def available(self, sku: str) -> int:
        """Units that can still be promised: on hand minus reserved."""
        if sku not in self.products:
            return 0
        return self.on_hand[sku] - self.reserved[sku]

    def reserve(self, order: Order) -> None:
        """Reserve every line of `order`, or nothing at all if any line is short."""
        for item in order.items:
            have = self.available(item.product.sku)
            if item.quantity > have:
                raise OutOfStock(item.product.sku, item.quantity, have)
        for item in order.items:
            self.reserved[item.product.sku] += item.quantity

    def release(self, order: Order) -> None:
        """Give back the reservation of an order that was cancelled."""
        for item in order.items:
            sku = item.product.sku
            self.reserved[sku] = max(0, self.reserved[sku] - item.quantity)

    def ship(self, order: Order) -> None:
        """The reserved goods leave the warehouse."""
        for item in order.items:
            sku = item.product.sku
            if self.reserved[sku] < item.quantity:
                raise ValueError(f"{sku} was not reserved")
        for item in order.items:
            sku = item.product.sku
            self.reserved[sku] -= item.quantity
            self.on_hand[sku] -= item.quantity

    def low_stock(self, threshold: int) -> list[str]:
        """SKUs whose available quantity is below `threshold`, sorted."""
        return sorted(sku for sku in self.products if self.available(sku) < threshold)

    def stock_value(self) -> Decimal:
        return sum((self.products[sku].price * qty for sku, qty in self.on_hand.items()), Decimal("0"))
