"""Small text helpers."""


def slugify(text: str) -> str:
    """Lowercase, runs of non-alphanumerics become one '-', none at the ends."""
    raise NotImplementedError
