"""Unit conversions."""


def to_celsius(fahrenheit):
    """Degrees Fahrenheit in degrees Celsius."""
    return (fahrenheit - 32) * 5 / 9


def to_minutes(text):
    """'H:MM' as a number of minutes."""
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)
