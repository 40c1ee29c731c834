"""Entry points that other training frameworks call into tryloop with."""
