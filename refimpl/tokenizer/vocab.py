"""The GGUF vocabulary as llama.cpp loads it (``llama_vocab::impl::load``), and encode/decode on it."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import gguf

from refimpl.errors import RefimplError
from refimpl.tokenizer.bpe import bpe_merge, byte_encode, unicode_to_bytes
from refimpl.tokenizer.split import split_qwen2, split_qwen35

PRE_SPLITS = {"qwen35": split_qwen35, "qwen2": split_qwen2}  # tokenizer.ggml.pre → split (Qwen3.5/3.6; Qwen3-Next)

class TokenAttr(enum.IntFlag):
    """``llama_token_attr`` (include/llama.h): what llama.cpp derives from ``tokenizer.ggml.token_type``."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# Plain ints from here on: a 248k-entry vocabulary is built and scanned with them (IntFlag arithmetic
# per token cost over a second at load).
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = (int(a) for a in (
    TokenAttr.UNKNOWN, TokenAttr.UNUSED, TokenAttr.NORMAL, TokenAttr.CONTROL, TokenAttr.USER_DEFINED, TokenAttr.BYTE))

_ATTR_OF_TYPE = {
    int(gguf.TokenType.NORMAL): NORMAL,
    int(gguf.TokenType.UNKNOWN): UNKNOWN,
    int(gguf.TokenType.CONTROL): CONTROL,
    int(gguf.TokenType.USER_DEFINED): USER_DEFINED,
    int(gguf.TokenType.UNUSED): UNUSED,
    int(gguf.TokenType.BYTE): BYTE,
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


class _ReaderKeys:
    """``GGUFFile.key`` over a ``gguf.GGUFReader`` (for a caller that holds a reader): strings are
    decoded here, entry by entry, so that one that is not UTF-8 is refused in one line naming it —
    gguf-py's ``contents()`` raises a bare ``UnicodeDecodeError``. (``GGUFFile.key`` refuses such
    text itself, naming the key and the entry.)"""

    def __init__(self, reader: gguf.GGUFReader, path=None):
        self.reader, self.path = reader, path or getattr(reader.data, "filename", None) or "GGUF"

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def key(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        T = gguf.GGUFValueType
        if field.types == [T.STRING]:
            return self._text(field.parts[-1], f"metadata key '{key}'")
        if field.types[0] == T.ARRAY and field.types[-1] == T.STRING:
            name = _ENTRY.get(key, f"metadata key '{key}' entry {{i}}")
            return [self._text(field.parts[idx], name.format(i=i)) for i, idx in enumerate(field.data)]
        return field.contents()

    def _text(self, raw, what: str) -> str:
        try:
            return raw.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RefimplError(f"{self.path}: {what} is not valid UTF-8 (byte {exc.start}: "
                               f"{raw.tobytes()[exc.start : exc.start + 4]!r})") from None


_ENTRY = {_K.LIST: "tokenizer token {i}", _K.MERGES: f"{_K.MERGES} entry {{i}}"}  # how _ReaderKeys names a bad entry
_ARRAY_KEYS = (_K.LIST, _K.MERGES, _K.TOKEN_TYPE)
_KIND_NAME = {str: "text", int: "an integer", bool: "a bool"}


def _read_field(source, key: str, default=None, kind: type = str):
    """The value of ``tokenizer.ggml.*`` key ``key`` in ``source`` (anything with ``GGUFFile.key``),
    or ``default`` when absent, checked to be of ``kind`` (str, int or bool; for the token list, the
    merges and the token types, a list of them). Another type is refused in one line, as llama.cpp's
    typed ``get_key`` / ``gguf_get_arr_str`` refuse it."""
    value = source.key(key, None)
    if value is None:
        return default
    is_kind = (lambda v: isinstance(v, int) and not isinstance(v, bool)) if kind is int else (lambda v: isinstance(v, kind))
    if key in _ARRAY_KEYS:  # a GGUF array declares one element type: its first item tells it
        ok = isinstance(value, list) and (not value or is_kind(value[0]))
    else:
        ok = is_kind(value)
    if not ok:
        expected = f"a list of {_KIND_NAME[kind]}s" if key in _ARRAY_KEYS else _KIND_NAME[kind]
        got = f"list of {type(next((v for v in value if not is_kind(v)), None)).__name__}" if isinstance(value, list) else type(value).__name__
        raise RefimplError(f"{source.path}: metadata key '{key}' holds {got}, expected {expected}")
    return value


def _merge_ranks(merges: Sequence[str]) -> dict[tuple[str, str], int]:
    """``tokenizer.ggml.merges`` → {(left, right): rank}. Each entry is split at its first space after
    position 0 (no space: the pair ("", "")); the first of duplicate pairs keeps its rank."""
    pairs = [(m[:cut], m[cut + 1 :]) if (cut := m.find(" ", 1)) >= 0 else ("", "") for m in merges]
    return dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1)))  # later duplicates overwritten by earlier


def _special_tokens(tokens: Sequence[str], id_of: Mapping[str, int], attrs: list[int], gguf_ids: Mapping[str, int]):
    """llama.cpp's special-token pass of ``llama_vocab::impl::load``, in its order.

    ``id_of`` maps each token text to its id; ``attrs`` (plain ints of :class:`TokenAttr`) is updated
    in place. Returns (special ids by GGUF key, end-of-generation ids):

    * ids: the ``gpt2`` defaults BOS = EOS = 11, replaced by in-range ``*_token_id`` values; FIM
      ids not in the GGUF are found by token text (and forced to CONTROL);
    * control tokens whose text contains ``unused`` get UNUSED (affects neither ids nor pieces);
    * EOG: FIM pad/repo/file-sep, every token with an end-of-turn-looking text (forced to
      CONTROL), then EOS/EOT/EOM; minus ``<|end|>`` (harmony, solar-open) and ``</s>`` (gemma4,
      plamo) when their marker tokens are present; gpt-oss channel tokens become USER_DEFINED.

    Texts are looked up in ``id_of`` (each text names one token), never by a scan of the vocabulary.
    """
    n_vocab = len(tokens)
    ids = {key: i for key, i in _DEFAULT_SPECIAL_IDS.items() if i < n_vocab}
    ids.update({key: i for key, i in gguf_ids.items() if key in _SPECIAL_ID_KEYS and 0 <= i < n_vocab})
    for key, texts in _FIM_TEXTS.items():
        found = sorted(id_of[text] for text in texts if text in id_of)
        if key not in ids and found:
            ids[key] = found[0]  # llama.cpp takes the first in hash-map order; here the lowest id
            attrs[found[0]] |= CONTROL
    for i, a in enumerate(attrs):
        if a & CONTROL and "unused" in tokens[i]:
            attrs[i] = a | UNUSED

    eog = {ids[k] for k in (_K.FIM_PAD_ID, _K.FIM_REP_ID, _K.FIM_SEP_ID) if k in ids}
    for i in sorted(id_of[text] for text in _EOG_TEXTS | set(_ALWAYS_USER_DEFINED) if text in id_of):
        if tokens[i] in _EOG_TEXTS:
            eog.add(i)
            attrs[i] |= CONTROL
        if tokens[i] in _ALWAYS_USER_DEFINED:
            attrs[i] = USER_DEFINED
    eog |= {ids[k] for k in (_K.EOS_ID, _K.EOT_ID, _K.EOM_ID) if k in ids}
    by_text = {tokens[i]: i for i in eog}
    if "<|end|>" in by_text and ({"<|return|>", "<|call|>"} <= by_text.keys() or {"<|calls|>", "<|flush|>"} <= by_text.keys()):
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = USER_DEFINED
    if "</s>" in by_text and {"<|tool_response>", "<|plamo:eos|>"} & by_text.keys():
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = NORMAL
    return ids, frozenset(eog)


class Tokenizer:
    """A ``gpt2``/``qwen35`` GGUF vocabulary: encode text to ids and ids back to bytes/text.

    Attributes: ``n_vocab``; ``tokens`` (GGUF token texts) and ``attrs`` (:class:`TokenAttr` values as plain ints, after
    llama.cpp's by-text fix-ups); ``bos_id``, ``eos_id`` (``None`` if absent); ``eog_ids``
    (frozenset: EOS plus tokens llama.cpp treats as end-of-generation); ``add_bos``, ``add_eos``.
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int] | None,
                 merges: Sequence[str] | Callable[[], Sequence[str]], *,
                 special_ids: Mapping[str, int] | None = None, add_bos: bool = False, add_eos: bool = False,
                 pre: str = "qwen35"):
        """Build from GGUF metadata values; ``special_ids`` maps ``tokenizer.ggml.*_token_id`` keys to ids;
        ``pre``: the pre-tokenizer (a key of :data:`PRE_SPLITS`). ``merges`` may be a function that
        returns them: they are then read at the first :meth:`encode` (a run given token ids never reads
        a real vocabulary's ~250k merges)."""
        self.split = PRE_SPLITS[pre]
        # llama.cpp renames empty texts and asserts that no text repeats
        self.tokens = tuple(text or f"[EMPTY_{i}]" for i, text in enumerate(tokens))
        self.n_vocab = len(self.tokens)
        self._id_of = {text: i for i, text in enumerate(self.tokens)}
        if len(self._id_of) != self.n_vocab:
            raise RefimplError(f"{_K.LIST} has duplicate token texts ({self.n_vocab - len(self._id_of)} repeats)")
        types = token_types if token_types is not None else [gguf.TokenType.NORMAL] * self.n_vocab
        if len(types) < self.n_vocab:
            raise RefimplError(f"{_K.TOKEN_TYPE} has {len(types)} entries for {self.n_vocab} tokens")
        attrs = [_ATTR_OF_TYPE.get(t, 0) for t in types[: self.n_vocab]]  # 0: UNDEFINED
        self._merges, self._ranks_of_merges = merges, None

        ids, self.eog_ids = _special_tokens(self.tokens, self._id_of, attrs, special_ids or {})
        self.attrs = tuple(attrs)
        self.bos_id, self.eos_id = ids.get(_K.BOS_ID), ids.get(_K.EOS_ID)
        self.add_bos, self.add_eos = add_bos, add_eos

        # what tokenizer_st_partition cuts out: longest UTF-8 text first (std::sort; ties here by id)
        special = [i for i, a in enumerate(self.attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        self._special_longest_first = sorted(special, key=lambda i: -len(self.tokens[i].encode()))

    @property
    def _ranks(self) -> dict[tuple[str, str], int]:
        """The merge ranks, built on first use."""
        if self._ranks_of_merges is None:
            self._ranks_of_merges = _merge_ranks(self._merges() if callable(self._merges) else self._merges)
        return self._ranks_of_merges

    @classmethod
    def from_gguf(cls, source) -> Tokenizer:
        """Read ``tokenizer.ggml.*`` from a GGUF — a :class:`~refimpl.io.gguf_file.GGUFFile`, a
        ``gguf.GGUFReader`` or a path; only ``model="gpt2"`` with ``pre`` "qwen35" or "qwen2" is
        supported. Every way the vocabulary can be unreadable (a key of the wrong type, text that is
        not UTF-8) is a one-line :class:`RefimplError`."""
        if isinstance(source, (str, Path)):
            from refimpl.io.gguf_file import GGUFFile  # a damaged file is refused in one line there

            source = GGUFFile(source)
        if isinstance(source, gguf.GGUFReader):
            source = _ReaderKeys(source)
        model, pre = _read_field(source, _K.MODEL), _read_field(source, _K.PRE)
        if model != "gpt2":
            raise RefimplError(f"{source.path}: unsupported tokenizer: {_K.MODEL} = {model!r} (refimpl reads only 'gpt2' byte-level BPE)")
        if pre not in PRE_SPLITS:
            raise RefimplError(f"{source.path}: unsupported pre-tokenizer: {_K.PRE} = {pre!r} (refimpl implements {', '.join(map(repr, PRE_SPLITS))})")
        tokens = _read_field(source, _K.LIST)
        if tokens is None or not source.has(_K.MERGES):
            raise RefimplError(f"{source.path}: GGUF has no {_K.LIST if tokens is None else _K.MERGES}")
        merges = functools.partial(_read_field, source, _K.MERGES)  # read at the first encode
        special_ids = {key: _read_field(source, key, kind=int) for key in _SPECIAL_ID_KEYS}
        token_types = _read_field(source, _K.TOKEN_TYPE, kind=int)
        add_bos, add_eos = _read_field(source, _K.ADD_BOS, False, kind=bool), _read_field(source, _K.ADD_EOS, False, kind=bool)
        try:
            return cls(tokens, token_types, merges, special_ids={key: i for key, i in special_ids.items() if i is not None},
                       add_bos=add_bos, add_eos=add_eos, pre=pre)
        except RefimplError as exc:  # duplicate texts, too few token types: name the file
            raise RefimplError(f"{source.path}: {exc}") from None

    # ---- encode --------------------------------------------------------------------------------

    def encode(self, text: str, *, parse_special: bool = False, faults=None) -> list[int]:
        """``llama_tokenize(vocab, text, add_special=True, parse_special)``: text → token ids.

        BOS is prepended only if the GGUF sets ``add_bos_token`` (Qwen's do not), EOS appended only
        if it sets ``add_eos_token``. User-defined token texts always become their ids; control
        token texts only with ``parse_special`` (otherwise they are tokenized as plain text).
        ``faults``: a :class:`refimpl.inject.faults.Faults` record (``run --inject pretok-gpt2``).
        """
        ids = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        for fragment in self._partition_special(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                continue
            words = self.split(fragment)
            for word in faults.tap("tokenizer.split", words, text=fragment) if faults else words:
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
            if not parse_special and self.attrs[tid] & (CONTROL | UNKNOWN):
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
        if attr & (UNKNOWN | CONTROL):
            return text.encode() if special else b""
        if attr & USER_DEFINED:
            return text.encode()
        if attr & NORMAL:
            return self._decode_alphabet(text)
        if attr & BYTE:  # "<0xXX>" byte-fallback tokens (not used by Qwen)
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
