"""The GGUF tokenizer of a Qwen3.5/3.6 model: byte-level BPE with the ``qwen35`` pre-tokenizer (or
Qwen3-Next's ``qwen2``: :func:`split_qwen2`, the same split without combining marks in letter runs).

Token ids are those of llama.cpp's ``llama_tokenize(vocab, text, add_special=True, parse_special)``
(``src/llama-vocab.cpp``). ``encode`` runs the same five steps:

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

``piece``/``decode`` invert it (``token_to_piece``, ``llama_decode_text``). Modules: ``split``
(code-point classes, :func:`split_qwen35`) → ``bpe`` (byte alphabet, :func:`bpe_merge`) →
``vocab`` (:class:`Tokenizer`: GGUF metadata, specials, encode, decode). docs/tokenizer.md walks
through one string.

May import: ``refimpl.errors`` and ``refimpl.io`` (the GGUF file it reads the vocabulary from).
"""

from refimpl.tokenizer.bpe import bpe_merge, byte_encode, bytes_to_unicode, unicode_to_bytes
from refimpl.tokenizer.split import LLAMA_CPP_UNICODE_VERSION, QWEN35_REGEX, char_class, split_qwen2, split_qwen35
from refimpl.tokenizer.vocab import TokenAttr, Tokenizer

__all__ = [
    "LLAMA_CPP_UNICODE_VERSION",
    "QWEN35_REGEX",
    "TokenAttr",
    "Tokenizer",
    "bpe_merge",
    "byte_encode",
    "bytes_to_unicode",
    "char_class",
    "split_qwen2",
    "split_qwen35",
    "unicode_to_bytes",
]
