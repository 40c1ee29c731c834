import pytest
from mathkit import clamp, digit_sum, factorial, fibonacci, fibonacci_sequence, gcd, is_perfect, lcm


def test_gcd():
    assert gcd(12, 18) == 6
    assert gcd(18, 12) == 6
    assert gcd(17, 5) == 1
    assert gcd(0, 9) == 9
    assert gcd(9, 0) == 9
    assert gcd(0, 0) == 0
    assert gcd(-12, 18) == 6
    assert gcd(12, -18) == 6
    assert gcd(100, 75) == 25


def test_lcm():
    assert lcm(4, 6) == 12
    assert lcm(6, 4) == 12
    assert lcm(3, 5) == 15
    assert lcm(7, 7) == 7
    assert lcm(0, 5) == 0
    assert lcm(5, 0) == 0
    assert lcm(0, 0) == 0
    assert lcm(1, 5) == 5
    assert lcm(5, 1) == 5
    assert lcm(-4, 6) == 12
    assert lcm(21, 6) == 42


def test_factorial():
    assert factorial(0) == 1
    assert factorial(1) == 1
    assert factorial(2) == 2
    assert factorial(5) == 120
    assert factorial(10) == 3628800
    with pytest.raises(ValueError):
        factorial(-1)


def test_fibonacci():
    assert fibonacci(0) == 0
    assert fibonacci(1) == 1
    assert fibonacci(2) == 1
    assert fibonacci(3) == 2
    assert fibonacci(10) == 55
    assert fibonacci(30) == 832040
    with pytest.raises(ValueError):
        fibonacci(-1)


def test_fibonacci_sequence():
    assert fibonacci_sequence(0) == []
    assert fibonacci_sequence(1) == [0]
    assert fibonacci_sequence(2) == [0, 1]
    assert fibonacci_sequence(8) == [0, 1, 1, 2, 3, 5, 8, 13]
    assert fibonacci_sequence(15)[-1] == fibonacci(14)


def test_digit_sum():
    assert digit_sum(0) == 0
    assert digit_sum(7) == 7
    assert digit_sum(10) == 1
    assert digit_sum(12345) == 15
    assert digit_sum(-987) == 24
    assert digit_sum(1000001) == 2


def test_clamp():
    assert clamp(5, 0, 10) == 5
    assert clamp(-3, 0, 10) == 0
    assert clamp(15, 0, 10) == 10
    assert clamp(0, 0, 10) == 0
    assert clamp(10, 0, 10) == 10
    assert clamp(2.5, 1.0, 2.0) == 2.0
    assert clamp(4, 4, 4) == 4
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_is_perfect():
    assert [n for n in range(1, 10000) if is_perfect(n)] == [6, 28, 496, 8128]
    assert is_perfect(1) is False
    assert is_perfect(0) is False
    assert is_perfect(12) is False
    assert is_perfect(36) is False
