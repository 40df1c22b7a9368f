"""Reference solutions for the bundled code-generation tasks of specstudy.

Each top-level function below is one task. The task prompt is the function signature and its
docstring; the reference solution is the function body. The examples in every docstring are
doctests, so ``python -m doctest reference_solutions.py`` checks the solutions.

Written for this project and dedicated to the public domain (CC0-1.0).
"""

from __future__ import annotations


def add_numbers(a: int, b: int) -> int:
    """Return the sum of two integers.

    >>> add_numbers(2, 3)
    5
    >>> add_numbers(-4, 4)
    0
    """
    return a + b


def is_palindrome(text: str) -> bool:
    """Return True if ``text`` reads the same forwards and backwards.

    Letters are compared without regard to case, and every character that is not a letter or a
    digit is ignored.

    >>> is_palindrome("A man, a plan, a canal: Panama")
    True
    >>> is_palindrome("hello")
    False
    """
    cleaned = [ch.lower() for ch in text if ch.isalnum()]
    return cleaned == cleaned[::-1]


def count_vowels(text: str) -> int:
    """Count the vowels (a, e, i, o, u) in ``text``, ignoring case.

    >>> count_vowels("Hello World")
    3
    >>> count_vowels("xyz")
    0
    """
    return sum(1 for ch in text.lower() if ch in "aeiou")


def fizz_buzz(n: int) -> list[str]:
    """Return the FizzBuzz sequence from 1 to ``n`` as a list of strings.

    Multiples of three become "Fizz", multiples of five become "Buzz", and multiples of both
    become "FizzBuzz". Every other number is written as digits.

    >>> fizz_buzz(5)
    ['1', '2', 'Fizz', '4', 'Buzz']
    >>> fizz_buzz(15)[-1]
    'FizzBuzz'
    """
    result = []
    for i in range(1, n + 1):
        word = ""
        if i % 3 == 0:
            word += "Fizz"
        if i % 5 == 0:
            word += "Buzz"
        result.append(word or str(i))
    return result


def factorial(n: int) -> int:
    """Return n! for a non-negative integer ``n``.

    Raise ValueError when ``n`` is negative.

    >>> factorial(0)
    1
    >>> factorial(5)
    120
    """
    if n < 0:
        raise ValueError("n must be non-negative")
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result


def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number, where fibonacci(0) == 0 and fibonacci(1) == 1.

    >>> fibonacci(1)
    1
    >>> fibonacci(10)
    55
    """
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_prime(n: int) -> bool:
    """Return True if ``n`` is a prime number.

    Numbers smaller than two are not prime.

    >>> is_prime(2)
    True
    >>> is_prime(21)
    False
    >>> is_prime(97)
    True
    """
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    divisor = 3
    while divisor * divisor <= n:
        if n % divisor == 0:
            return False
        divisor += 2
    return True


def primes_up_to(limit: int) -> list[int]:
    """Return all prime numbers less than or equal to ``limit`` in increasing order.

    Use the sieve of Eratosthenes.

    >>> primes_up_to(20)
    [2, 3, 5, 7, 11, 13, 17, 19]
    >>> primes_up_to(1)
    []
    """
    if limit < 2:
        return []
    sieve = [True] * (limit + 1)
    sieve[0] = sieve[1] = False
    for number in range(2, int(limit**0.5) + 1):
        if sieve[number]:
            for multiple in range(number * number, limit + 1, number):
                sieve[multiple] = False
    return [number for number, prime in enumerate(sieve) if prime]


def gcd(a: int, b: int) -> int:
    """Return the greatest common divisor of two non-negative integers.

    >>> gcd(12, 18)
    6
    >>> gcd(7, 0)
    7
    """
    while b:
        a, b = b, a % b
    return a


def reverse_words(sentence: str) -> str:
    """Return the words of ``sentence`` in reverse order, separated by single spaces.

    Leading, trailing and repeated whitespace is dropped.

    >>> reverse_words("the quick  brown fox")
    'fox brown quick the'
    >>> reverse_words("   ")
    ''
    """
    return " ".join(reversed(sentence.split()))


def word_frequencies(text: str) -> dict[str, int]:
    """Count how often each word occurs in ``text``.

    Words are separated by whitespace, compared in lower case, and stripped of the punctuation
    characters ``.,;:!?``. The result maps each word to its count.

    >>> word_frequencies("The cat saw the dog. The dog ran!")
    {'the': 3, 'cat': 1, 'saw': 1, 'dog': 2, 'ran': 1}
    """
    counts: dict[str, int] = {}
    for raw in text.split():
        word = raw.strip(".,;:!?").lower()
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts


def flatten(nested: list) -> list:
    """Flatten an arbitrarily nested list of lists into a single flat list.

    >>> flatten([1, [2, [3, 4]], [], 5])
    [1, 2, 3, 4, 5]
    >>> flatten([])
    []
    """
    flat = []
    for item in nested:
        if isinstance(item, list):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat


def chunk_list(items: list, size: int) -> list[list]:
    """Split ``items`` into consecutive chunks of length ``size``.

    The last chunk may be shorter. Raise ValueError when ``size`` is not positive.

    >>> chunk_list([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    >>> chunk_list([], 3)
    []
    """
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[i : i + size] for i in range(0, len(items), size)]


def remove_duplicates(items: list) -> list:
    """Return a new list with duplicates removed, keeping the first occurrence of each item.

    >>> remove_duplicates([3, 1, 3, 2, 1])
    [3, 1, 2]
    >>> remove_duplicates(["a", "b", "a"])
    ['a', 'b']
    """
    seen = set()
    result = []
    for item in items:
        if item not in seen:
            seen.add(item)
            result.append(item)
    return result


def merge_sorted(left: list[int], right: list[int]) -> list[int]:
    """Merge two sorted lists into one sorted list without calling ``sorted``.

    >>> merge_sorted([1, 4, 9], [2, 3, 10])
    [1, 2, 3, 4, 9, 10]
    >>> merge_sorted([], [1])
    [1]
    """
    merged = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            j += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged


def binary_search(items: list[int], target: int) -> int:
    """Return the index of ``target`` in the sorted list ``items``, or -1 if it is absent.

    >>> binary_search([1, 3, 5, 7, 9], 7)
    3
    >>> binary_search([1, 3, 5], 4)
    -1
    """
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1


def running_average(values: list[float]) -> list[float]:
    """Return the running average of ``values``: element i is the mean of values[0..i].

    >>> running_average([2, 4, 6])
    [2.0, 3.0, 4.0]
    >>> running_average([])
    []
    """
    averages = []
    total = 0.0
    for index, value in enumerate(values, start=1):
        total += value
        averages.append(total / index)
    return averages


def median(values: list[float]) -> float:
    """Return the median of a non-empty list of numbers.

    For an even number of values, return the mean of the two middle values.

    >>> median([3, 1, 2])
    2
    >>> median([4, 1, 3, 2])
    2.5
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def caesar_cipher(text: str, shift: int) -> str:
    """Shift every ASCII letter in ``text`` by ``shift`` places, wrapping around the alphabet.

    Case is preserved and other characters are left unchanged.

    >>> caesar_cipher("Hello, World!", 3)
    'Khoor, Zruog!'
    >>> caesar_cipher("abc", -1)
    'zab'
    """
    result = []
    for ch in text:
        if "a" <= ch <= "z":
            result.append(chr((ord(ch) - ord("a") + shift) % 26 + ord("a")))
        elif "A" <= ch <= "Z":
            result.append(chr((ord(ch) - ord("A") + shift) % 26 + ord("A")))
        else:
            result.append(ch)
    return "".join(result)


def run_length_encode(text: str) -> str:
    """Compress ``text`` with run-length encoding: each run becomes the count followed by the character.

    >>> run_length_encode("aaabccdddd")
    '3a1b2c4d'
    >>> run_length_encode("")
    ''
    """
    if not text:
        return ""
    parts = []
    current, count = text[0], 1
    for ch in text[1:]:
        if ch == current:
            count += 1
        else:
            parts.append(f"{count}{current}")
            current, count = ch, 1
    parts.append(f"{count}{current}")
    return "".join(parts)


def balanced_brackets(text: str) -> bool:
    """Return True if every bracket in ``text`` is closed in the right order.

    The bracket pairs are (), [] and {}; every other character is ignored.

    >>> balanced_brackets("{[()()]}")
    True
    >>> balanced_brackets("([)]")
    False
    >>> balanced_brackets("(")
    False
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack


def to_snake_case(name: str) -> str:
    """Convert a CamelCase or camelCase identifier to snake_case.

    >>> to_snake_case("CamelCaseName")
    'camel_case_name'
    >>> to_snake_case("already_snake")
    'already_snake'
    """
    result = []
    for index, ch in enumerate(name):
        if ch.isupper():
            if index > 0 and name[index - 1] != "_":
                result.append("_")
            result.append(ch.lower())
        else:
            result.append(ch)
    return "".join(result)


def anagram_groups(words: list[str]) -> list[list[str]]:
    """Group words that are anagrams of each other.

    Groups appear in the order of their first word, and words inside a group keep their input
    order.

    >>> anagram_groups(["listen", "google", "silent", "enlist", "gogole"])
    [['listen', 'silent', 'enlist'], ['google', 'gogole']]
    """
    groups: dict[str, list[str]] = {}
    for word in words:
        key = "".join(sorted(word))
        groups.setdefault(key, []).append(word)
    return list(groups.values())


def matrix_transpose(matrix: list[list[int]]) -> list[list[int]]:
    """Return the transpose of a rectangular matrix given as a list of rows.

    >>> matrix_transpose([[1, 2, 3], [4, 5, 6]])
    [[1, 4], [2, 5], [3, 6]]
    >>> matrix_transpose([])
    []
    """
    if not matrix:
        return []
    return [[row[col] for row in matrix] for col in range(len(matrix[0]))]


def max_subarray_sum(values: list[int]) -> int:
    """Return the largest sum of a non-empty contiguous slice of ``values``.

    >>> max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4])
    6
    >>> max_subarray_sum([-3, -1, -2])
    -1
    """
    best = current = values[0]
    for value in values[1:]:
        current = max(value, current + value)
        best = max(best, current)
    return best


def roman_to_int(numeral: str) -> int:
    """Convert a Roman numeral such as "MCMXCIV" to an integer.

    >>> roman_to_int("XIV")
    14
    >>> roman_to_int("MCMXCIV")
    1994
    """
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for index, ch in enumerate(numeral):
        value = values[ch]
        if index + 1 < len(numeral) and values[numeral[index + 1]] > value:
            total -= value
        else:
            total += value
    return total


def int_to_binary(n: int) -> str:
    """Return the binary representation of a non-negative integer without the "0b" prefix.

    >>> int_to_binary(10)
    '1010'
    >>> int_to_binary(0)
    '0'
    """
    if n == 0:
        return "0"
    digits = []
    while n > 0:
        digits.append(str(n % 2))
        n //= 2
    return "".join(reversed(digits))


def parse_key_values(line: str) -> dict[str, str]:
    """Parse a line such as "name=Ada; role=engineer" into a dictionary.

    Pairs are separated by semicolons, keys and values by the first equals sign, and surrounding
    whitespace is removed. Empty pairs are skipped.

    >>> parse_key_values("name=Ada; role=engineer;")
    {'name': 'Ada', 'role': 'engineer'}
    >>> parse_key_values("")
    {}
    """
    result = {}
    for pair in line.split(";"):
        if not pair.strip():
            continue
        key, _, value = pair.partition("=")
        result[key.strip()] = value.strip()
    return result


def second_largest(values: list[int]) -> int | None:
    """Return the second largest distinct value in ``values``, or None if there is none.

    >>> second_largest([4, 1, 4, 3])
    3
    >>> second_largest([7, 7])
    """
    distinct = sorted(set(values), reverse=True)
    return distinct[1] if len(distinct) > 1 else None


def rotate_list(items: list, steps: int) -> list:
    """Rotate ``items`` to the right by ``steps`` positions and return a new list.

    >>> rotate_list([1, 2, 3, 4, 5], 2)
    [4, 5, 1, 2, 3]
    >>> rotate_list([1, 2, 3], -1)
    [2, 3, 1]
    >>> rotate_list([], 3)
    []
    """
    if not items:
        return []
    steps %= len(items)
    return items[-steps:] + items[:-steps] if steps else list(items)


def title_case(sentence: str, small_words: tuple[str, ...] = ("a", "an", "the", "of", "and", "in")) -> str:
    """Capitalize each word of ``sentence`` except small words, which stay lower case.

    The first word is always capitalized.

    >>> title_case("the lord of the rings")
    'The Lord of the Rings'
    >>> title_case("a tale in two cities")
    'A Tale in Two Cities'
    """
    words = sentence.lower().split()
    result = []
    for index, word in enumerate(words):
        if index > 0 and word in small_words:
            result.append(word)
        else:
            result.append(word.capitalize())
    return " ".join(result)


def count_islands(grid: list[list[int]]) -> int:
    """Count groups of horizontally or vertically connected 1s in a grid of 0s and 1s.

    >>> count_islands([[1, 1, 0], [0, 1, 0], [1, 0, 1]])
    3
    >>> count_islands([[0, 0], [0, 0]])
    0
    """
    rows = len(grid)
    cols = len(grid[0]) if rows else 0
    seen = set()
    islands = 0
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] != 1 or (r, c) in seen:
                continue
            islands += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == 1 and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
    return islands


def longest_common_prefix(words: list[str]) -> str:
    """Return the longest string that is a prefix of every word in ``words``.

    >>> longest_common_prefix(["flower", "flow", "flight"])
    'fl'
    >>> longest_common_prefix(["dog", "car"])
    ''
    >>> longest_common_prefix([])
    ''
    """
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        while not word.startswith(prefix):
            prefix = prefix[:-1]
    return prefix


def celsius_table(start: int, stop: int, step: int) -> list[tuple[int, float]]:
    """Return (celsius, fahrenheit) pairs from ``start`` up to and including ``stop``.

    Fahrenheit values are rounded to one decimal place.

    >>> celsius_table(0, 20, 10)
    [(0, 32.0), (10, 50.0), (20, 68.0)]
    """
    return [(c, round(c * 9 / 5 + 32, 1)) for c in range(start, stop + 1, step)]
