"""A small inventory and ordering domain."""

from inventory.models import Inventory, LineItem, Order, OutOfStock, Product
from inventory.pricing import (
    BuyXGetY,
    FixedOff,
    PercentOff,
    Quote,
    money,
    parse_coupon,
    price_order,
)
from inventory.validation import ValidationError, check_order, validate_quantity, validate_sku

__all__ = [
    "BuyXGetY", "FixedOff", "Inventory", "LineItem", "Order", "OutOfStock", "PercentOff", "Product", "Quote",
    "ValidationError", "check_order", "money", "parse_coupon", "price_order", "validate_quantity", "validate_sku",
]
