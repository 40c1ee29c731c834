"""Integer arithmetic."""


def gcd(a, b):
    """Greatest common divisor of two integers; always non-negative. gcd(0, 0) == 0."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def lcm(a, b):
    """Least common multiple of two integers; 0 if either is 0."""
    if a == 0 or b == 0:
        return 0
    return abs(a * b) // gcd(a, b)


def factorial(n):
    """n! for n >= 0."""
    if n < 0:
        raise ValueError("factorial of a negative number")
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result


def fibonacci(n):
    """The n-th Fibonacci number: fibonacci(0) == 0, fibonacci(1) == 1."""
    if n < 0:
        raise ValueError("n must be non-negative")
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def fibonacci_sequence(count):
    """The first `count` Fibonacci numbers, starting 0, 1, 1, 2, ..."""
    seq = []
    a, b = 0, 1
    while len(seq) < count:
        seq.append(a)
        a, b = b, a + b
    return seq


def digit_sum(n):
    """Sum of the decimal digits of |n|."""
    n = abs(n)
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total


def clamp(x, lo, hi):
    """`x` limited to the closed range [lo, hi]."""
    if lo > hi:
        raise ValueError("lo must not exceed hi")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def is_perfect(n):
    """True if n > 1 equals the sum of its proper divisors (6, 28, 496, ...)."""
    if n < 2:
        return False
    total = 1
    d = 2
    while d * d <= n:
        if n % d == 0:
            total += d
            other = n // d
            if other != d:
                total += other
        d += 1
    return total == n
