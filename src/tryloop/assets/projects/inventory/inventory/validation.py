"""Checks on input before it reaches the inventory."""

from __future__ import annotations

import re

from inventory.models import Inventory, Order

SKU_RE = re.compile(r"^[A-Z]{3}-\d{4}$")
MAX_QUANTITY = 1000


class ValidationError(ValueError):
    pass


def validate_sku(sku) -> str:
    """Return `sku` normalised to upper case, or raise ValidationError. Format: ABC-1234."""
    if not isinstance(sku, str):
        raise ValidationError("sku must be a string")
    norm = sku.strip().upper()
    if not SKU_RE.match(norm):
        raise ValidationError(f"bad sku {sku!r}")
    return norm


def validate_quantity(quantity) -> int:
    """A quantity is an int (not a bool) from 1 to MAX_QUANTITY."""
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise ValidationError("quantity must be an integer")
    if quantity < 1:
        raise ValidationError("quantity must be at least 1")
    if quantity > MAX_QUANTITY:
        raise ValidationError(f"quantity must be at most {MAX_QUANTITY}")
    return quantity


def check_order(order: Order, inventory: Inventory) -> list[str]:
    """All problems that would stop `order` from being reserved, as messages; [] if none."""
    problems = []
    if order.is_empty():
        problems.append("order is empty")
    for item in order.items:
        sku = item.product.sku
        try:
            validate_sku(sku)
        except ValidationError as exc:
            problems.append(str(exc))
            continue
        if sku not in inventory.products:
            problems.append(f"unknown sku {sku}")
            continue
        try:
            validate_quantity(item.quantity)
        except ValidationError as exc:
            problems.append(f"{sku}: {exc}")
            continue
        have = inventory.available(sku)
        if item.quantity > have:
            problems.append(f"{sku}: only {have} available")
    return problems
