import pytest
from mathkit import is_prime, prime_factors, primes_up_to

SMALL_PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97]


def test_is_prime_small():
    assert [n for n in range(100) if is_prime(n)] == SMALL_PRIMES


def test_is_prime_edges():
    assert is_prime(-7) is False
    assert is_prime(0) is False
    assert is_prime(1) is False
    assert is_prime(2) is True
    assert is_prime(3) is True
    assert is_prime(4) is False
    assert is_prime(9) is False
    assert is_prime(25) is False
    assert is_prime(49) is False


def test_is_prime_large():
    assert is_prime(7919) is True
    assert is_prime(104729) is True
    assert is_prime(7917) is False
    assert is_prime(10403) is False  # 101 * 103


def test_primes_up_to():
    assert primes_up_to(100) == SMALL_PRIMES
    assert primes_up_to(97) == SMALL_PRIMES
    assert primes_up_to(96) == SMALL_PRIMES[:-1]
    assert primes_up_to(2) == [2]
    assert primes_up_to(3) == [2, 3]
    assert primes_up_to(4) == [2, 3]
    assert primes_up_to(25) == [2, 3, 5, 7, 11, 13, 17, 19, 23]
    assert primes_up_to(1) == []
    assert primes_up_to(0) == []
    assert primes_up_to(-5) == []


def test_primes_up_to_matches_is_prime():
    assert primes_up_to(1000) == [n for n in range(1001) if is_prime(n)]
    assert len(primes_up_to(1000)) == 168


def test_prime_factors():
    assert prime_factors(2) == [2]
    assert prime_factors(12) == [2, 2, 3]
    assert prime_factors(97) == [97]
    assert prime_factors(360) == [2, 2, 2, 3, 3, 5]
    assert prime_factors(49) == [7, 7]
    assert prime_factors(10403) == [101, 103]
    assert prime_factors(2 ** 10) == [2] * 10


def test_prime_factors_product():
    for n in range(2, 300):
        product = 1
        for f in prime_factors(n):
            assert is_prime(f)
            product *= f
        assert product == n


def test_prime_factors_rejects_small():
    with pytest.raises(ValueError):
        prime_factors(1)
    with pytest.raises(ValueError):
        prime_factors(0)
