"""Byte-level BPE: GPT-2's byte alphabet and merging by rank (``src/unicode.cpp``, ``src/llama-vocab.cpp``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

# --------------------------------------------------------------------------------------------------
# The byte alphabet
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → character map (``unicode.cpp::unicode_byte_to_utf8_map``).

    Printable bytes ``!..~``, ``¡..¬``, ``®..ÿ`` stand for themselves; the other 68 bytes, in order,
    become U+0100.. (so the space 0x20 is ``Ġ`` U+0120 and LF 0x0A is ``Ċ`` U+010A).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for i, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + i)
    return dict(sorted(table.items()))


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of :func:`bytes_to_unicode` (``unicode_utf8_to_byte_map``)."""
    return {ch: b for b, ch in bytes_to_unicode().items()}


def byte_encode(word: str) -> str:
    """A word's UTF-8 bytes, one alphabet character per byte (lone surrogates pass through as llama.cpp's decoder does)."""
    alphabet = bytes_to_unicode()
    return "".join(alphabet[b] for b in word.encode("utf-8", "surrogatepass"))


# --------------------------------------------------------------------------------------------------
# Merging by rank
# --------------------------------------------------------------------------------------------------


def bpe_merge(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Merge the characters of one byte-encoded word into symbols (``llm_tokenizer_bpe_session``).

    Repeatedly merge the adjacent pair with the lowest rank (its index in ``tokenizer.ggml.merges``),
    the leftmost one on ties, until no adjacent pair has a rank. llama.cpp does the same with a
    priority queue of ``llm_bigram_bpe`` ordered by (rank, left index) whose stale entries it skips;
    the queue always holds every current adjacent pair, so it pops exactly the pair found here.
    """
    symbols = list(word)
    while True:
        best_rank, best_i = None, -1
        for i in range(len(symbols) - 1):
            rank = ranks.get((symbols[i], symbols[i + 1]))
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None:
            return symbols
        symbols[best_i : best_i + 2] = [symbols[best_i] + symbols[best_i + 1]]
