"""The GGUF tokenizer of a Qwen3.5/3.6 model: byte-level BPE with the ``qwen35`` pre-tokenizer.

Token ids are those of llama.cpp's ``llama_tokenize(vocab, text, add_special=True, parse_special)``
(``src/llama-vocab.cpp``). ``encode`` runs the same five steps, in this file's order:

1. **Special-token partition** (``tokenizer_st_partition``): control / user-defined token texts
   found in the input are cut out as whole tokens, longest text first. User-defined tokens
   (``<think>``) are cut out even with ``parse_special=False``; control tokens only with it.
2. **Pre-split** each remaining text fragment into words: :func:`split_qwen35`
   (``src/unicode.cpp::unicode_regex_split_custom_qwen35``), using llama.cpp's code-point classes
   (:func:`char_class`, ``src/unicode-data.cpp``).
3. **Byte-encode** each word: its UTF-8 bytes, each spelled as one character of GPT-2's byte
   alphabet (:func:`bytes_to_unicode`, ``unicode_byte_to_utf8_map``).
4. **Merge** adjacent symbols by rank, lowest rank first, leftmost on ties (:func:`bpe_merge`,
   ``llm_tokenizer_bpe_session::tokenize``).
5. **Look up** each symbol's id; BOS/EOS only if the GGUF asks (Qwen's does not).

``piece``/``decode`` invert it (``token_to_piece``, ``llama_decode_text``). docs/tokenizer.md walks
through one string.
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import gguf

from refimpl.errors import RefimplError

# --------------------------------------------------------------------------------------------------
# 1. Code-point classes, as llama.cpp's generated tables give them
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
# 2. The qwen35 pre-tokenizer split
# --------------------------------------------------------------------------------------------------

QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# llama.cpp compares unicode_tolower(next) with ASCII letters; only A-Z lowercase onto them.
_CONTRACTION_1 = frozenset("sStTmMdD")
_CONTRACTION_2 = frozenset({"re", "rE", "Re", "RE", "ve", "vE", "Ve", "VE", "ll", "lL", "Ll", "LL"})


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
        elif not (ch in "\r\n" or k == "N") and (k in "LM" or cls(pos + 1) in ("L", "M")):
            end = pos + 1  # 2. [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
            while cls(end) in ("L", "M"):
                end += 1
        elif k == "N":  # 3. \p{N}
            end = pos + 1
        elif (cls(pos + 1) if ch == " " else k) not in ("W", "L", "M", "N"):
            end = pos + (ch == " ")  # 4. <space>?[^\s\p{L}\p{M}\p{N}]+[\r\n]*  (a lone final space too)
            while cls(end) == "O":
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
# 3. The byte alphabet
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
# 4. Merging by rank
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


# --------------------------------------------------------------------------------------------------
# 5. The vocabulary
# --------------------------------------------------------------------------------------------------


class TokenAttr(enum.IntFlag):
    """``llama_token_attr`` (include/llama.h): what llama.cpp derives from ``tokenizer.ggml.token_type``."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


_ATTR_OF_TYPE = {
    gguf.TokenType.NORMAL: TokenAttr.NORMAL,
    gguf.TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    gguf.TokenType.CONTROL: TokenAttr.CONTROL,
    gguf.TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    gguf.TokenType.UNUSED: TokenAttr.UNUSED,
    gguf.TokenType.BYTE: TokenAttr.BYTE,
}  # any other type value (0 included) → UNDEFINED

_K = gguf.Keys.Tokenizer
# Special-id keys read from the GGUF. For "gpt2" vocabularies llama.cpp defaults BOS and EOS to 11.
_DEFAULT_SPECIAL_IDS = {_K.BOS_ID: 11, _K.EOS_ID: 11}
_SPECIAL_ID_KEYS = (_K.BOS_ID, _K.EOS_ID, _K.EOT_ID, _K.EOM_ID, _K.UNK_ID, _K.SEP_ID, _K.PAD_ID,
                    _K.MASK_ID, _K.FIM_PRE_ID, _K.FIM_SUF_ID, _K.FIM_MID_ID, _K.FIM_PAD_ID,
                    _K.FIM_REP_ID, _K.FIM_SEP_ID)

# llama-vocab.cpp "auto-detect special tokens by text": if the GGUF key is absent, a token with one
# of these texts becomes that special token and is forced to CONTROL. (EOT/EOM detection is left
# out: all its texts are in _EOG_TEXTS below, which does the same and more.)
_FIM_TEXTS = {
    _K.FIM_PRE_ID: ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    _K.FIM_SUF_ID: ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    _K.FIM_MID_ID: ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
    _K.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    _K.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    _K.FIM_SEP_ID: ("<|file_sep|>",),
}
# Tokens with these texts end generation (and are forced to CONTROL).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


def _read_field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


class Tokenizer:
    """A ``gpt2``/``qwen35`` GGUF vocabulary: encode text to ids and ids back to bytes/text.

    Attributes: ``n_vocab``; ``tokens`` (GGUF token texts) and ``attrs`` (:class:`TokenAttr`, after
    llama.cpp's by-text fix-ups); ``bos_id``, ``eos_id`` (``None`` if absent); ``eog_ids``
    (frozenset: EOS plus tokens llama.cpp treats as end-of-generation); ``add_bos``, ``add_eos``.
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int] | None, merges: Sequence[str], *,
                 special_ids: Mapping[str, int] | None = None, add_bos: bool = False, add_eos: bool = False):
        """Build from GGUF metadata values; ``special_ids`` maps ``tokenizer.ggml.*_token_id`` keys to ids."""
        # tokens: llama.cpp renames empty texts and lets a later duplicate win, then asserts none exist
        self.tokens = tuple(text or f"[EMPTY_{i}]" for i, text in enumerate(tokens))
        self.n_vocab = len(self.tokens)
        self._id_of = {text: i for i, text in enumerate(self.tokens)}
        if len(self._id_of) != self.n_vocab:
            raise RefimplError(f"{_K.LIST} has duplicate token texts ({self.n_vocab - len(self._id_of)} repeats)")
        types = token_types if token_types is not None else [gguf.TokenType.NORMAL] * self.n_vocab
        if len(types) < self.n_vocab:
            raise RefimplError(f"{_K.TOKEN_TYPE} has {len(types)} entries for {self.n_vocab} tokens")
        attrs = [_ATTR_OF_TYPE.get(t, TokenAttr.UNDEFINED) for t in types[: self.n_vocab]]

        # merges: "left right", split at the first space after position 0; the first duplicate wins
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)
            pair = (merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", "")
            self._ranks.setdefault(pair, rank)

        # special ids: the gpt2 default unless out of range, replaced by an in-range GGUF value
        ids = {key: i for key, i in _DEFAULT_SPECIAL_IDS.items() if i < self.n_vocab}
        ids.update({key: i for key, i in (special_ids or {}).items() if key in _SPECIAL_ID_KEYS and 0 <= i < self.n_vocab})
        for key, texts in _FIM_TEXTS.items():
            found = [i for i, text in enumerate(self.tokens) if text in texts]
            if key not in ids and found:
                ids[key] = found[0]  # llama.cpp takes the first in hash-map order; here the lowest id
                attrs[found[0]] |= TokenAttr.CONTROL
        self.bos_id, self.eos_id = ids.get(_K.BOS_ID), ids.get(_K.EOS_ID)
        for i, text in enumerate(self.tokens):  # "auto-detect unused tokens" (no effect on ids or pieces)
            if attrs[i] & TokenAttr.CONTROL and "unused" in text:
                attrs[i] |= TokenAttr.UNUSED

        # end-of-generation set (llama-vocab.cpp, "maintain a list of tokens that cause end-of-generation")
        eog = {ids[k] for k in (_K.FIM_PAD_ID, _K.FIM_REP_ID, _K.FIM_SEP_ID) if k in ids}
        for i, text in enumerate(self.tokens):
            if text in _EOG_TEXTS:
                eog.add(i)
                attrs[i] |= TokenAttr.CONTROL
            if text in _ALWAYS_USER_DEFINED:
                attrs[i] = TokenAttr.USER_DEFINED
        eog |= {ids[k] for k in (_K.EOS_ID, _K.EOT_ID, _K.EOM_ID) if k in ids}
        eog_texts = {self.tokens[i]: i for i in eog}
        if "<|end|>" in eog_texts and ({"<|return|>", "<|call|>"} <= eog_texts.keys() or {"<|calls|>", "<|flush|>"} <= eog_texts.keys()):
            eog.discard(eog_texts["<|end|>"])  # harmony / solar-open: <|end|> ends a message, not generation
            attrs[eog_texts["<|end|>"]] = TokenAttr.USER_DEFINED
        if "</s>" in eog_texts and ({"<|tool_response>", "<|plamo:eos|>"} & eog_texts.keys()):
            eog.discard(eog_texts["</s>"])  # gemma4 / plamo: a normal token there
            attrs[eog_texts["</s>"]] = TokenAttr.NORMAL
        self.eog_ids = frozenset(eog)
        self.attrs = tuple(attrs)
        self.add_bos, self.add_eos = add_bos, add_eos

        # texts that tokenizer_st_partition cuts out: longest UTF-8 first (std::sort, ties here by id)
        special = [i for i, a in enumerate(self.attrs) if a & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)]
        self._special_longest_first = sorted(special, key=lambda i: -len(self.tokens[i].encode()))

    @classmethod
    def from_gguf(cls, reader_or_path: gguf.GGUFReader | str | Path) -> Tokenizer:
        """Read ``tokenizer.ggml.*`` from a GGUF; only ``model="gpt2"`` with ``pre="qwen35"`` is supported."""
        reader = reader_or_path if isinstance(reader_or_path, gguf.GGUFReader) else gguf.GGUFReader(reader_or_path)
        model, pre = _read_field(reader, _K.MODEL), _read_field(reader, _K.PRE)
        if model != "gpt2":
            raise RefimplError(f"unsupported tokenizer: {_K.MODEL} = {model!r} (refimpl reads only 'gpt2' byte-level BPE)")
        if pre != "qwen35":
            raise RefimplError(f"unsupported pre-tokenizer: {_K.PRE} = {pre!r} (refimpl implements only 'qwen35')")
        tokens = _read_field(reader, _K.LIST)
        merges = _read_field(reader, _K.MERGES)
        if tokens is None or merges is None:
            raise RefimplError(f"GGUF has no {_K.LIST if tokens is None else _K.MERGES}")
        special_ids = {key: _read_field(reader, key) for key in _SPECIAL_ID_KEYS if key in reader.fields}
        return cls(tokens, _read_field(reader, _K.TOKEN_TYPE), merges, special_ids=special_ids,
                   add_bos=bool(_read_field(reader, _K.ADD_BOS, False)),
                   add_eos=bool(_read_field(reader, _K.ADD_EOS, False)))

    # ---- encode --------------------------------------------------------------------------------

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """``llama_tokenize(vocab, text, add_special=True, parse_special)``: text → token ids.

        BOS is prepended only if the GGUF sets ``add_bos_token`` (Qwen's do not), EOS appended only
        if it sets ``add_eos_token``. User-defined token texts always become their ids; control
        token texts only with ``parse_special`` (otherwise they are tokenized as plain text).
        """
        ids = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        for fragment in self._partition_special(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                continue
            for word in split_qwen35(fragment):
                for symbol in bpe_merge(byte_encode(word), self._ranks):
                    ids.extend(self._symbol_ids(symbol))
        if self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _partition_special(self, text: str, parse_special: bool) -> list[str | int]:
        """``tokenizer_st_partition``: cut special-token texts out of ``text``, longest first.

        Each special text splits every remaining raw fragment at its non-overlapping leftmost
        occurrences; empty raw pieces are dropped. (The LSTRIP/RSTRIP attributes llama.cpp sets for a
        few named models -- phi-3, jina, modern-bert -- never apply to qwen35 files.)
        """
        fragments: list[str | int] = [text] if text else []
        for tid in self._special_longest_first:
            if not parse_special and self.attrs[tid] & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
                continue
            special_text, cut = self.tokens[tid], []
            for fragment in fragments:
                if isinstance(fragment, int):
                    cut.append(fragment)
                    continue
                for j, piece in enumerate(fragment.split(special_text)):
                    if j:
                        cut.append(tid)
                    if piece:
                        cut.append(piece)
            fragments = cut
        return fragments

    def _symbol_ids(self, symbol: str) -> list[int]:
        """A merged symbol's id; for a symbol missing from the vocab, llama.cpp looks up each single
        *byte* of its UTF-8 text, so only ASCII bytes can match and the rest are silently dropped."""
        tid = self._id_of.get(symbol)
        if tid is not None:
            return [tid]
        return [self._id_of[chr(b)] for b in symbol.encode() if b < 0x80 and chr(b) in self._id_of]

    # ---- decode --------------------------------------------------------------------------------

    def piece(self, tid: int, *, special: bool = True) -> bytes:
        """``llama_token_to_piece(vocab, tid, lstrip=0, special)``: the bytes one token stands for.

        Normal tokens are byte-decoded through the alphabet; control/unknown tokens render their text
        when ``special`` and nothing otherwise; user-defined tokens always render their text as is;
        unused/undefined tokens (the ``[PAD…]`` fillers) render nothing.
        """
        if not 0 <= tid < self.n_vocab:
            raise RefimplError(f"token id {tid} is out of range [0, {self.n_vocab})")
        attr, text = self.attrs[tid], self.tokens[tid]
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL):
            return text.encode() if special else b""
        if attr & TokenAttr.USER_DEFINED:
            return text.encode()
        if attr & TokenAttr.NORMAL:
            return self._decode_alphabet(text)
        if attr & TokenAttr.BYTE:  # "<0xXX>" byte-fallback tokens (not used by Qwen)
            return bytes([int(text[3:5], 16)])
        return b""

    @staticmethod
    def _decode_alphabet(text: str) -> bytes:
        """``llama_decode_text``: alphabet characters → bytes. A character outside the alphabet becomes
        ``[UNK_BYTE_0x<its utf-8 hex><the whole token text>]``, as llama.cpp writes it."""
        to_byte, out = unicode_to_bytes(), bytearray()
        for ch in text:
            if ch in to_byte:
                out.append(to_byte[ch])
            else:
                out += f"[UNK_BYTE_0x{ch.encode().hex()}{text}]".encode()
        return bytes(out)

    def decode(self, ids: Sequence[int], *, special: bool = True) -> str:
        """Concatenate :meth:`piece` of each id and decode the bytes as UTF-8 (invalid bytes → U+FFFD).

        ``special=True`` (the default, llama.cpp's ``common_detokenize`` default) renders control
        tokens such as ``<|im_end|>`` as their text, so ``decode(encode(s, parse_special=p)) == s``
        for either ``p``. No spaces are cleaned up: ``qwen35`` sets ``clean_spaces = false``.
        """
        return b"".join(self.piece(tid, special=special) for tid in ids).decode("utf-8", errors="replace")
