"""The ``qwen35`` pre-tokenizer: llama.cpp's code-point classes and its hand-written splitter.

``char_class`` reproduces the flags of ``src/unicode-data.cpp`` that the splitter reads (letter,
mark, number, whitespace); ``split_qwen35`` is ``src/unicode.cpp::unicode_regex_split_custom_qwen35``.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

# --------------------------------------------------------------------------------------------------
# Code-point classes, as llama.cpp's generated tables give them
# --------------------------------------------------------------------------------------------------

#: llama.cpp's ``unicode-data.cpp`` was generated from Unicode 15.1 (CJK Extension I is in it).
LLAMA_CPP_UNICODE_VERSION = "15.1.0"

# ``unicode_set_whitespace``: Unicode White_Space. Not ``str.isspace()``, which adds U+001C..U+001F.
_WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
     0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)

# Letters (L), marks (M) and numbers (N) assigned in Unicode 15.0/15.1 and therefore unassigned (Cn)
# in Python 3.11's unicodedata (Unicode 14.0). Inclusive ranges; derived by diffing every code point
# of unicodedata against llama.cpp's ``unicode_ranges_flags``. Symbols/punctuation/format characters
# added in 15.x are left out: for the qwen35 split they behave exactly like unassigned code points.
_UNICODE_15_LMN_ADDITIONS = (
    (0x00CF3, 0x00CF3, "M"),  # Kannada
    (0x00ECE, 0x00ECE, "M"),  # Lao
    (0x10EFD, 0x10EFF, "M"),  # Arabic Extended-C
    (0x1123F, 0x11240, "L"),  # Khojki
    (0x11241, 0x11241, "M"),
    (0x11F00, 0x11F01, "M"),  # Kawi
    (0x11F02, 0x11F02, "L"),
    (0x11F03, 0x11F03, "M"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F34, 0x11F3A, "M"),
    (0x11F3E, 0x11F42, "M"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),  # Egyptian hieroglyphs and format controls
    (0x13440, 0x13440, "M"),
    (0x13441, 0x13446, "L"),
    (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"),  # small kana
    (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"),  # Kaktovik numerals
    (0x1DF25, 0x1DF2A, "L"),  # Latin Extended-G
    (0x1E030, 0x1E06D, "L"),  # Cyrillic Extended-D
    (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"),  # Nag Mundari
    (0x1E4EC, 0x1E4EF, "M"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x2B739, 0x2B739, "L"),  # CJK Extension B addition
    (0x2EBF0, 0x2EE5D, "L"),  # CJK Extension I (15.1)
    (0x31350, 0x323AF, "L"),  # CJK Extension H
)


@lru_cache(maxsize=1 << 16)
def char_class(ch: str) -> str:
    """The class of one code point as llama.cpp's splitter sees it: one of ``"WLMNO"``.

    ``W`` whitespace (``unicode_set_whitespace``), ``L`` letter ``\\p{L}``, ``M`` mark ``\\p{M}``,
    ``N`` number ``\\p{N}``, ``O`` anything else (punctuation, symbol, control, surrogate, private
    use, unassigned). No whitespace code point is a letter, mark or number, so one letter suffices.
    The category comes from ``unicodedata`` (Unicode 14.0 on Python 3.11), corrected to
    llama.cpp's Unicode 15.1 by :data:`_UNICODE_15_LMN_ADDITIONS`.
    """
    cpt = ord(ch)
    if cpt in _WHITESPACE:
        return "W"
    category = unicodedata.category(ch)
    if category == "Cn":
        for first, last, cls in _UNICODE_15_LMN_ADDITIONS:
            if first <= cpt <= last:
                return cls
    return category[0] if category[0] in "LMN" else "O"


# --------------------------------------------------------------------------------------------------
# The qwen35 pre-tokenizer split
# --------------------------------------------------------------------------------------------------

QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# llama.cpp compares unicode_tolower(next) with ASCII letters; only A-Z lowercase onto them.
_CONTRACTION_1 = frozenset("sStTmMdD")
_CONTRACTION_2 = frozenset({"re", "rE", "Re", "RE", "ve", "vE", "Ve", "VE", "ll", "lL", "Ll", "LL"})


def split_qwen2(text: str) -> list[str]:
    r"""The ``qwen2`` pre-tokenizer (Qwen3-Next's GGUFs): :func:`split_qwen35` with combining marks
    ``\p{M}`` not joining letter runs — ``src/unicode.cpp::unicode_regex_split_custom_qwen2``, whose
    only differences from the qwen35 function are the ``is_accent_mark`` tests in alternatives 2 and 4.
    Regex: ``(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+``.
    """
    return _split(text, letters=("L",))


def split_qwen35(text: str) -> list[str]:
    """Split ``text`` into the words BPE then merges within, exactly as llama.cpp's ``qwen35``.

    The pre-tokenizer regex of Qwen3.5's tokenizer.json is :data:`QWEN35_REGEX`. In words, at each
    position the first alternative that matches takes the longest run it can:

    1. an English contraction ``'s 't 're 've 'm 'll 'd``, any case (``'S``, ``'LL``);
    2. an optional single character that is not CR, LF, letter or digit (a space, tab,
       punctuation, symbol, mark), then a run of letters **or combining marks** ``[\\p{L}\\p{M}]+``;
    3. one digit ``\\p{N}`` (numbers are split one digit per word);
    4. an optional space, a run of characters that are not whitespace/letter/mark/digit, then any
       CR/LF right after it;
    5. whitespace up to and including the last CR/LF of a whitespace run;
    6. a run of whitespace not followed by a non-space: in a run that ends before a non-space, all
       but its last character (which then prefixes the next word);
    7. any other whitespace run (at the end of the text).

    The only difference from the Qwen2 regex is ``\\p{M}`` joining letter runs. llama.cpp never runs
    the regex: this is a line-by-line port of its hand-written
    ``src/unicode.cpp::unicode_regex_split_custom_qwen35``, with classes from :func:`char_class`.
    ``"".join(split_qwen35(s)) == s`` always holds.
    """
    return _split(text, letters=("L", "M"))


def _split(text: str, letters: tuple[str, ...]) -> list[str]:
    """The qwen35 / qwen2 split; ``letters``: the classes a letter run takes (qwen35 adds marks "M")."""
    others = tuple(c for c in ("O", "M") if c not in letters)  # alternative 4's run: not whitespace, letter or digit
    n = len(text)
    classes = [char_class(ch) for ch in text]

    def cls(i: int) -> str | None:  # None past the end (llama.cpp: flags 0)
        return classes[i] if i < n else None

    words: list[str] = []
    pos = 0
    while pos < n:
        ch, k = text[pos], classes[pos]
        if ch == "'" and text[pos + 1 : pos + 2] in _CONTRACTION_1:  # 1. 's 't 'm 'd
            end = pos + 2
        elif ch == "'" and text[pos + 1 : pos + 3] in _CONTRACTION_2:  # 1. 're 've 'll
            end = pos + 3
        elif not (ch in "\r\n" or k == "N") and (k in letters or cls(pos + 1) in letters):
            end = pos + 1  # 2. [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+  (qwen2: \p{L}+)
            while cls(end) in letters:
                end += 1
        elif k == "N":  # 3. \p{N}
            end = pos + 1
        elif (cls(pos + 1) if ch == " " else k) not in ("W", "N", *letters):
            end = pos + (ch == " ")  # 4. <space>?[^\s\p{L}\p{M}\p{N}]+[\r\n]*  (qwen2: marks in the run; a lone final space too)
            while cls(end) in others:
                end += 1
            while end < n and text[end] in "\r\n":
                end += 1
        else:  # a whitespace run [pos, run_end); newline_end is just past its last CR/LF
            run_end, newline_end = pos, 0
            while cls(run_end) == "W":
                if text[run_end] in "\r\n":
                    newline_end = run_end + 1
                run_end += 1
            if newline_end:  # 5. \s*[\r\n]+
                end = newline_end
            elif run_end - pos > 1 and run_end < n:  # 6. \s+(?!\S)
                end = run_end - 1
            elif run_end > pos:  # 7. \s+
                end = run_end
            else:  # no alternative matches (unreachable: every class is handled above)
                end = pos + 1
        words.append(text[pos:end])
        pos = end
    return words


# --------------------------------------------------------------------------------------------------
# The gpt2 split: what a qwen35 file gets from an engine that falls back to the generic regex
# --------------------------------------------------------------------------------------------------

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def split_gpt2(text: str) -> list[str]:
    """Split ``text`` by :data:`GPT2_REGEX`, as ``src/unicode.cpp::unicode_regex_split_custom_gpt2``.

    Not what a qwen35 file uses: it is here for the injected fault ``pretok-gpt2`` (bug class B20,
    refimpl.inject.faults): an engine that routes ``tokenizer.ggml.pre = qwen35`` to the generic regex.
    Against :func:`split_qwen35`: contractions are lower-case only; a letter run takes only a space
    before it (not any punctuation character) and no combining marks; digits run together; no
    alternative keeps CR/LF apart. (llama.cpp gives an unassigned code point no flags, so it is a
    word of its own there; here it joins a punctuation run. No fault run meets one.)
    """
    n = len(text)
    classes = [char_class(ch) for ch in text]

    def cls(i: int) -> str | None:  # None past the end
        return classes[i] if i < n else None

    words: list[str] = []
    pos = 0
    while pos < n:
        ch = text[pos]
        k2 = cls(pos + 1) if ch == " " else classes[pos]
        if ch == "'" and text[pos + 1 : pos + 2] in ("s", "t", "m", "d"):  # 's 't 'm 'd
            end = pos + 2
        elif ch == "'" and text[pos + 1 : pos + 3] in ("re", "ve", "ll"):  # 're 've 'll
            end = pos + 3
        elif k2 in ("L", "N"):  # <space>?\p{L}+ and <space>?\p{N}+
            end = pos + (ch == " ")
            while cls(end) == k2:
                end += 1
        elif k2 in ("M", "O"):  # <space>?[^\s\p{L}\p{N}]+
            end = pos + (ch == " ")
            while cls(end) in ("M", "O"):
                end += 1
        else:  # whitespace: \s+(?!\S), then \s+
            run_end = pos
            while cls(run_end) == "W":
                run_end += 1
            end = run_end - 1 if run_end - pos > 1 and run_end < n else run_end
        words.append(text[pos:end])
        pos = end
    return words
