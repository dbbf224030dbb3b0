"""Count the primes below 250,000 in 10 threads, each sending its count on a channel."""
from frost.parallel import Channel, finish, spawn, split


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def count_primes(numbers, ch):
    ch << sum(1 for n in numbers if is_prime(n))


def main() -> int:
    ch = Channel(10)
    with finish():  # waits for the 10 tasks, then closes ch: its senders are done
        spawn(count_primes, split(range(250_000), 10), ch)
    return ch.sum()


if __name__ == "__main__":
    print(main())  # 22044
