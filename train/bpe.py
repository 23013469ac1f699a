"""A byte-level BPE vocabulary learned on the corpus, split with llama.cpp's ``qwen35`` pre-tokenizer.

The words BPE counts are exactly the words llama.cpp merges within: :func:`refimpl.tokenizer.split_qwen35`
(a port of ``unicode_regex_split_custom_qwen35``), each byte-encoded with GPT-2's alphabet. Then plain
BPE: repeatedly merge the most frequent adjacent pair (ties: the lexicographically smallest pair),
skipping a pair whose concatenation is already a token (GGUF token texts must be unique), until the
vocabulary has ``n_vocab`` tokens. Layout (``refimpl.fixtures.vocab.vocab_from_merges``): ids 0..255
the byte tokens in byte order (id b spells byte b; the fixtures put the printable bytes first), then
one token per merge in rank order, then the five special tokens (``<|endoftext|>`` … ``</think>``).
No padding tokens.

llama.cpp encodes by merge *rank*, which is what the learned order is; tests/test_trained.py checks
that llama.cpp's ids equal refimpl's on the held-out text.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from refimpl.fixtures.vocab import SPECIAL_TOKENS, Vocab, vocab_from_merges
from refimpl.tokenizer import byte_encode, bytes_to_unicode, split_qwen35


def word_counts(text: str) -> Counter:
    """How often each byte-encoded qwen35 word occurs in ``text``."""
    return Counter(byte_encode(w) for w in split_qwen35(text))


def learn_merges(words: Counter, n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE over ``words`` (byte-encoded word → count), with incremental pair counts."""
    seqs = [list(w) for w in words]  # each word as a list of symbols
    freq = list(words.values())
    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)  # pair → words containing it
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    tokens = set(bytes_to_unicode().values())
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges and pairs:
        best_count = max(pairs.values())
        if best_count < 2:
            break
        candidates = sorted(p for p, c in pairs.items() if c == best_count)
        best = next((p for p in candidates if p[0] + p[1] not in tokens), None)
        if best is None:  # every most-frequent pair would repeat a token: drop them and go on
            for p in candidates:
                del pairs[p]
            continue
        merges.append(best)
        new = best[0] + best[1]
        tokens.add(new)
        for i in list(where[best]):
            s = seqs[i]
            for a, b in zip(s, s[1:]):  # forget this word's old pairs
                pairs[(a, b)] -= freq[i]
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
                where[(a, b)].discard(i)
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == best:
                    out.append(new)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] += freq[i]
                where[(a, b)].add(i)
        pairs.pop(best, None)
    return merges


def build_trained_vocab(text: str, n_vocab: int) -> Vocab:
    """The vocabulary of exactly ``n_vocab`` tokens (module docstring) learned on ``text``."""
    n_merges = n_vocab - 256 - len(SPECIAL_TOKENS)
    merges = learn_merges(word_counts(text), n_merges)
    if len(merges) != n_merges:
        raise SystemExit(f"train: the corpus yields only {len(merges)} merges, {n_merges} needed for {n_vocab} tokens")
    return vocab_from_merges(merges, n_vocab, byte_tokens=bytes_to_unicode().values())  # exactly n_vocab: no fillers
