"""refimpl.tokenizer: the qwen35 split by hand, and token ids identical to llama.cpp's.

Ground truth is llama-cpp-python 0.3.36 (``Llama(path, vocab_only=True)``): ``tokenize`` is
``llama_tokenize(vocab, text, add_special=add_bos, parse_special=special)``, and pieces come from
``llama_token_to_piece``. The GGUF is the ``tiny`` fixture (vocab from refimpl.fixtures.vocab);
two small hand-made vocabularies cover the paths the fixture cannot reach (text rules for special
tokens, merges without a token, the code-point class of every Unicode code point).
"""

from __future__ import annotations

import ctypes
import heapq
import unicodedata

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_llama_cpp
from refimpl.errors import RefimplError
from refimpl.tokenizer import (
    LLAMA_CPP_UNICODE_VERSION,
    Tokenizer,
    bpe_merge,
    byte_encode,
    bytes_to_unicode,
    char_class,
    split_qwen2,
    split_qwen35,
)

# ---- the corpus ------------------------------------------------------------------------------------

CORPUS = [
    "Hello world",
    "It's, I'M, we'll WE'LL, they're THEY'RE, you've YOU'VE, I'd, don't DON'T, 'tis, rock 'n' roll, O'Neill's",
    "'S 's 'Re 'x '' ''s a' '",
    "e\u0301 cafe\u0301 re\u0301sume\u0301 na\u0308ive a\u0301\u0302\u0303b \u0301lone mark, x \u0301",
    "Café, naïve, Ångström, Straße, Übergröße, Dvořák, Tiếng Việt có dấu",
    "हिन्दी ภาษาไทย مَرْحَبًا עִבְרִית",
    "0 12 345 6789 3.14159 -7 1e-6 x2 2x ٣٤٥ ½ ⅕ ①② ２０２６",
    "a  b   c    d",
    "\t\tindented\n\ttab\tinside\t",
    "trailing spaces   ",
    "   leading spaces",
    "\u00a0nbsp\u3000ideographic\u2009thin\u2028line\u2029para\u0085nel",
    "\x0bvertical\x0cform feed \x1c\x1d\x1e\x1f separators are not whitespace",
    "line1\r\nline2\r\n\r\nline4\r",
    "\n\n\n",
    " \n \n ",
    "!!!\n\n?? ",
    "end.\r\n  next",
    "def f(x):\n    return x**2  # square\n\n\nprint(f(3))\n",
    "😀👍🏽 🇺🇸 👨\u200d👩\u200d👧 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 🫨",
    "中文文本，日本語のテキスト、한국어 텍스트。",
    "Ελληνικά русский язык עברית عربى",
    "Unicode 15: \U0002EBF0\U0002EBF1 \U00011F50\U00011F51 \U0001E4D0\U0001E4EC x\u0ECE",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|endoftext|>",
    "<|im_end|><|im_end|>",
    "x<think>y</think>z",
    "<|im_end <|im_end| < |im_end|> <<|im_start|>> <think",
    "<|im_end|>",
    "",
    " ",
    "'",
    "\u200dzwj \ufeffBOM \x00nul \x7fdel",
    "=" * 40 + " " + "a" * 60,
]


# ---- llama.cpp, the ground truth -----------------------------------------------------------------


_LLAMAS: dict = {}  # path -> llama_cpp.Llama, closed when the module's tests end


@pytest.fixture(scope="module", autouse=True)
def _close_llamas():
    yield
    while _LLAMAS:
        _LLAMAS.popitem()[1].close()


def _llama(path: str):
    if path not in _LLAMAS:
        llama_cpp = require_llama_cpp()
        _LLAMAS[path] = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    return _LLAMAS[path]


def llama_tokenize(path, text: str | bytes, *, add_special=True, parse_special=False) -> list[int]:
    data = text if isinstance(text, bytes) else text.encode()
    return _llama(str(path)).tokenize(data, add_bos=add_special, special=parse_special)


def llama_piece(path, tid: int, *, special: bool) -> bytes:
    llama_cpp = require_llama_cpp()
    model = _llama(str(path))
    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_token_to_piece(model._model.vocab, tid, buf, len(buf), 0, special)
    assert 0 <= n <= len(buf)
    return buf.raw[:n]


def llama_vocab_facts(path):
    """(n_vocab, eos, eog set, attrs) as llama.cpp's vocab reports them."""
    llama_cpp = require_llama_cpp()
    vocab = _llama(str(path))._model.vocab
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    eog = {i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    attrs = [int(llama_cpp.llama_vocab_get_attr(vocab, i)) for i in range(n)]
    return n, llama_cpp.llama_vocab_eos(vocab), eog, attrs


def write_vocab_gguf(path, tokens, types, merges, *, model="gpt2", pre="qwen35", **kv):
    """A GGUF holding only tokenizer metadata (llama.cpp's vocab_only load reads nothing else)."""
    w = gguf.GGUFWriter(str(path), "qwen35moe")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(f"tokenizer.ggml.{key}", value)
        else:
            w.add_uint32(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(make_fixture):
    return make_fixture("tiny")


@pytest.fixture(scope="module")
def tok(tiny):
    return Tokenizer.from_gguf(tiny)


# ---- split_qwen35 by hand ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        # contractions, any case; an apostrophe not starting one prefixes the letter run
        ("it's", ["it", "'s"]),
        ("IT'S", ["IT", "'S"]),
        ("we'LL they'Re I'D", ["we", "'LL", " they", "'Re", " I", "'D"]),
        ("'x 'lx", ["'x", " '", "lx"]),
        ("don't", ["don", "'t"]),
        # letters with combining marks stay one word; a mark may start the run
        ("cafe\u0301 ok", ["cafe\u0301", " ok"]),
        ("a\u0301\u0302b c", ["a\u0301\u0302b", " c"]),
        ("\u0301\u0301x", ["\u0301\u0301x"]),
        (" \u0301", [" \u0301"]),
        # digits: one per word, no space prefix
        ("2048", ["2", "0", "4", "8"]),
        ("x 42", ["x", " ", "4", "2"]),
        ("v1.2", ["v", "1", ".", "2"]),
        ("½٣", ["½", "٣"]),
        # whitespace runs: all but the last space before a word; the last prefixes the word
        ("a   b", ["a", "  ", " b"]),
        ("\t\tx", ["\t", "\tx"]),
        ("a \tb", ["a", " ", "\tb"]),
        # newlines: whitespace up to the last CR/LF is one word
        ("a\nb", ["a", "\n", "b"]),
        ("a\r\n\r\nb", ["a", "\r\n\r\n", "b"]),
        ("a \n  \n b", ["a", " \n  \n", " b"]),
        ("\n\n", ["\n\n"]),
        # trailing spaces are one word, a lone one too
        ("end   ", ["end", "   "]),
        ("end ", ["end", " "]),
        (" ", [" "]),
        # punctuation runs take one leading space and the CR/LF after them
        ("hi!!\n\nyo", ["hi", "!!\n\n", "yo"]),
        ("a ?!\r\nb", ["a", " ?!\r\n", "b"]),
        ("x . y", ["x", " .", " y"]),
        ("$%^&", ["$%^&"]),
        ("!x", ["!x"]),
        ("  (x)", [" ", " (", "x", ")"]),
        # separators that str.isspace() accepts but llama.cpp does not: punctuation-like
        ("a\x1c!b", ["a", "\x1c!", "b"]),
        ("a\u00a0!b", ["a", "\u00a0", "!b"]),  # no-break space is whitespace
        ("", []),
    ],
)
def test_split_qwen35_by_hand(text, words):
    assert split_qwen35(text) == words


@given(st.text(max_size=60))
def test_split_qwen35_covers_the_text(text):
    words = split_qwen35(text)
    assert "".join(words) == text and all(words)


def test_char_class_matches_llama_cpp_tables():
    assert [char_class(c) for c in "a\u0301\u00bd\u0663 \u3000\u2028!$\x1c\U000F0000"] == list("LMNNWWWOOOO")
    # Unicode 15.0/15.1 letters, marks and numbers that Python 3.11's unicodedata does not know yet
    assert [char_class(chr(c)) for c in (0x2EBF0, 0x31350, 0x11F50, 0x1E4EC, 0x0CF3)] == list("LLNMM")
    assert char_class("\U0001FAE9") == "O"  # assigned only in Unicode 16: unassigned for llama.cpp


def test_python_unicode_is_not_newer_than_llama_cpp_tables():
    """The class table corrects older unicodedata upward; a newer one would need removals instead."""
    version = tuple(map(int, unicodedata.unidata_version.split(".")))
    assert version <= tuple(map(int, LLAMA_CPP_UNICODE_VERSION.split("."))), (
        f"Python's Unicode {unicodedata.unidata_version} is newer than llama.cpp's "
        f"{LLAMA_CPP_UNICODE_VERSION}: code points assigned since then must be mapped back to 'O' "
        "in refimpl.tokenizer.char_class"
    )


# ---- merging -------------------------------------------------------------------------------------


def bpe_merge_priority_queue(word, ranks):
    """A direct port of llm_tokenizer_bpe_session::tokenize's queue (test-only twin of bpe_merge)."""
    text = list(word)  # text[i] is symbol i's text; "" once merged into its left neighbour
    nxt = list(range(1, len(word))) + [-1]
    prv = list(range(-1, len(word) - 1))
    queue = []

    def add(left, right):
        if left != -1 and right != -1 and (text[left], text[right]) in ranks:
            heapq.heappush(queue, (ranks[text[left], text[right]], left, right, text[left] + text[right]))

    for i in range(1, len(word)):
        add(i - 1, i)
    while queue:
        _, left, right, joined = heapq.heappop(queue)
        if not text[left] or not text[right] or text[left] + text[right] != joined:
            continue
        text[left], text[right] = joined, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        add(prv[left], left)
        add(left, nxt[left])
    return [t for t in text if t]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="aaabbbcd ", max_size=30))
def test_bpe_merge_equals_the_priority_queue(text):
    ranks = {("a", "a"): 0, ("a", "b"): 1, ("b", "b"): 2, ("aa", "a"): 3, ("b", "a"): 4, ("ab", "ab"): 5,
             ("c", "d"): 6, ("Ġ", "a"): 7, ("aa", "b"): 8, ("cd", "cd"): 9, ("bb", "b"): 1}
    word = byte_encode(text)
    assert bpe_merge(word, ranks) == bpe_merge_priority_queue(word, ranks)


def test_byte_alphabet():
    alphabet = bytes_to_unicode()
    assert len(set(alphabet.values())) == 256
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("!")], alphabet[0]) == ("Ġ", "Ċ", "!", "Ā")
    assert byte_encode(" é") == "ĠÃ©"


# ---- the fixture vocabulary against llama.cpp -------------------------------------------------------


@pytest.mark.oracle
def test_metadata(tok, tiny):
    assert (tok.n_vocab, tok.add_bos, tok.add_eos) == (512, False, False)
    assert tok.tokens[tok.eos_id] == "<|im_end|>"
    assert {tok.tokens[i] for i in tok.eog_ids} == {"<|im_end|>", "<|endoftext|>"}
    n_vocab, eos, eog, attrs = llama_vocab_facts(tiny)
    assert (n_vocab, eos, eog) == (tok.n_vocab, tok.eos_id, tok.eog_ids)
    assert attrs == [int(a) for a in tok.attrs]


@pytest.mark.oracle
@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_ids_equal_llama_cpp(tok, tiny, text, parse_special):
    ids = tok.encode(text, parse_special=parse_special)
    assert ids == llama_tokenize(tiny, text, parse_special=parse_special)
    assert ids == llama_tokenize(tiny, text, add_special=False, parse_special=parse_special)  # no BOS/EOS either way


def test_special_tokens(tok):
    im_end, think = tok.tokens.index("<|im_end|>"), tok.tokens.index("<think>")
    assert tok.encode("<|im_end|>", parse_special=True) == [im_end]
    assert im_end not in tok.encode("<|im_end|>")  # control: plain text without parse_special
    assert tok.encode("<think>") == [think] == tok.encode("<think>", parse_special=True)  # user-defined: always


_INTERESTING = list("aZé\u0301 \t\n\r'sStTlLrReEvVmMdD0٣½!?.,<>|_-x中😀\u00a0\u3000\x1c\u200d") + [
    "<|im_end|>", "<|im_start|>", "<think>", "</think>", "<|endoftext|>", "'ll", "'RE", "\r\n", "  ",
]


@pytest.mark.oracle
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(_INTERESTING) | st.characters(exclude_categories=("Cs",)), max_size=24),
       parse_special=st.booleans())
def test_ids_equal_llama_cpp_on_generated_text(tok, tiny, pieces, parse_special):
    text = "".join(pieces)
    assert tok.encode(text, parse_special=parse_special) == llama_tokenize(tiny, text, parse_special=parse_special)


@pytest.mark.oracle
def test_lone_surrogates_follow_llama_cpp(tok, tiny):
    """llama.cpp decodes UTF-8-encoded surrogates as code points (class O); so does refimpl."""
    text = "a\ud800b \udfff!"
    assert tok.encode(text) == llama_tokenize(tiny, text.encode("utf-8", "surrogatepass"))


@pytest.mark.oracle
@pytest.mark.parametrize("special", [False, True])
def test_every_piece_equals_llama_cpp(tok, tiny, special):
    assert [tok.piece(i, special=special) for i in range(tok.n_vocab)] == [
        llama_piece(tiny, i, special=special) for i in range(tok.n_vocab)
    ]


def test_pieces_of_special_and_padding_tokens(tok):
    im_end, think = (tok.tokens.index(t) for t in ("<|im_end|>", "<think>"))
    pad = next(i for i, t in enumerate(tok.tokens) if t.startswith("[PAD"))  # the first UNUSED filler
    assert (tok.piece(im_end), tok.piece(im_end, special=False)) == (b"<|im_end|>", b"")
    assert (tok.piece(think), tok.piece(think, special=False)) == (b"<think>", b"<think>")
    assert tok.piece(pad) == b""
    with pytest.raises(RefimplError, match="out of range"):
        tok.piece(tok.n_vocab)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_decode_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, parse_special=True)) == text


def test_decode_without_special_drops_control_tokens(tok):
    ids = tok.encode("<|im_start|>hi<think>x<|im_end|>", parse_special=True)
    assert tok.decode(ids, special=False) == "hi<think>x"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_decode_round_trip_generated(tok, text):
    assert tok.decode(tok.encode(text)) == text


# ---- hand-made vocabularies: the text rules, quirks and errors -------------------------------------


@pytest.mark.oracle
def test_text_rules_and_quirks_equal_llama_cpp(tmp_path):
    """FIM/EOG detection by text, forced CONTROL, empty tokens, merges without a token, odd pieces."""
    alphabet = list(bytes_to_unicode().values())
    N, C, U, B = (gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.BYTE)
    extra = [
        ("he", N), ("Ġhe", N), ("€x", N), ("<0x41>", B), ("", N),
        ("<|fim_prefix|>", U), ("<|fim_pad|>", U), ("<|repo_name|>", N), ("<|file_sep|>", C),
        ("<|endoftext|>", N), ("<|im_end|>", U), ("<|im_start|>", C), ("<tool_call>", U), ("<|unused_0|>", C),
    ]
    tokens = alphabet + [t for t, _ in extra]
    types = [N] * 256 + [int(k) for _, k in extra]
    merges = ["h e", "Ġ he", "Ġ !", "a b"]  # the last two have no token "Ġ!" / "ab"
    path = write_vocab_gguf(tmp_path / "rules.gguf", tokens, types, merges, eos_token_id=tokens.index("<|im_end|>"))
    tok = Tokenizer.from_gguf(path)

    n_vocab, eos, eog, attrs = llama_vocab_facts(path)
    assert (n_vocab, eos, eog) == (tok.n_vocab, tok.eos_id, tok.eog_ids)
    assert {tok.tokens[i] for i in eog} == {"<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|endoftext|>", "<|im_end|>"}
    assert attrs == [int(a) for a in tok.attrs]
    assert tok.tokens[tokens.index("")] == f"[EMPTY_{tokens.index('')}]"
    for text in ["he he! ab", "<|fim_prefix|>x<|fim_pad|><|repo_name|><|endoftext|><|im_end|><tool_call><|unused_0|>",
                 "<|im_start|>he<|im_start|>", "he!!!"]:
        for parse_special in (False, True):
            assert tok.encode(text, parse_special=parse_special) == llama_tokenize(path, text, parse_special=parse_special), text
    for special in (False, True):
        assert [tok.piece(i, special=special) for i in range(tok.n_vocab)] == [
            llama_piece(path, i, special=special) for i in range(tok.n_vocab)
        ]
    assert tok.piece(tokens.index("€x")) == b"[UNK_BYTE_0xe282ac\xe2\x82\xacx]x"


@pytest.mark.oracle
def test_add_bos_and_eos_when_the_gguf_asks(tmp_path):
    tokens = list(bytes_to_unicode().values()) + ["<s>", "</s>"]
    types = [1] * 256 + [3, 3]
    path = write_vocab_gguf(tmp_path / "bos.gguf", tokens, types, ["x y"], bos_token_id=256, eos_token_id=257,
                            add_bos_token=True, add_eos_token=True)
    tok = Tokenizer.from_gguf(path)
    assert tok.encode("hi") == [256, tokens.index("h"), tokens.index("i"), 257] == llama_tokenize(path, "hi")
    assert tok.encode("") == [256, 257] == llama_tokenize(path, "")


@pytest.mark.parametrize("key, value, kwargs", [
    ("tokenizer.ggml.model", "'llama'", {"model": "llama"}),
    ("tokenizer.ggml.pre", "'llama3'", {"pre": "llama3"}),
    ("tokenizer.ggml.pre", "None", {"pre": None}),
])
def test_unsupported_tokenizer_is_a_one_line_error(tmp_path, key, value, kwargs):
    path = write_vocab_gguf(tmp_path / "bad.gguf", list(bytes_to_unicode().values()), [1] * 256, [], **kwargs)
    with pytest.raises(RefimplError) as info:
        Tokenizer.from_gguf(gguf.GGUFReader(path))
    message = str(info.value)
    assert key in message and value in message and "\n" not in message


# ---- every code point classified as llama.cpp classifies it -----------------------------------------


@pytest.mark.oracle
@pytest.mark.slow
def test_every_code_point_class_equals_llama_cpp(tmp_path):
    """A probe vocabulary whose merges make the class of a code point c visible in the ids.

    Merges "a"+lead byte, "!"+lead byte and last byte+"a" exist, so per c three probes tell apart
    letter/mark (``a<c>`` one word), number or whitespace (``!<c>`` split) and whitespace or letter
    (``<c><c>a`` keeps ``<c>a`` together). One probe per code point of planes 0-3 and 14, and every
    61st elsewhere (planes 4-13 are unassigned, 15-16 private use); surrogates included.
    """
    alphabet = bytes_to_unicode()
    merges = [f"{p} {alphabet[b]}" for p in ("a", "!") for b in range(0xC2, 0xF5)]
    merges += [f"{alphabet[b]} a" for b in range(0xC0)]
    tokens = list(alphabet.values()) + [m.replace(" ", "") for m in merges]
    path = write_vocab_gguf(tmp_path / "probe.gguf", tokens, [1] * len(tokens), merges)
    tok = Tokenizer.from_gguf(path)
    cpts = [*range(0x40000), *range(0xE0000, 0xE1000), *range(0x40000, 0xE0000, 61), *range(0xE1000, 0x110000, 61)]
    for i in range(0, len(cpts), 8192):
        text = "".join(f"a{c}\n!{c}\n{c}{c}a\n" for c in map(chr, cpts[i : i + 8192]))
        expected = llama_tokenize(path, text.encode("utf-8", "surrogatepass"))
        assert tok.encode(text) == expected, f"a code point in U+{cpts[i]:04X}..U+{cpts[min(i + 8191, len(cpts) - 1)]:04X}"


MARK_TEXTS = ["e\u0301te\u0301 cafe\u0301!", "\u0301\u0301abc", "x \u0308\u0308 y", "a\u0300\u0300\u0300b  \u0301\n\u0302!?\u0301",
              "na\u0303o, se\u0301rie\u0301 1\u03012", "ok\u20dd\u20dd)", "\u0915\u093f\u0924\u093e\u092c"]


@pytest.mark.oracle
@pytest.mark.parametrize("pre", ["qwen2", "qwen35"])
def test_qwen2_and_qwen35_splits_equal_llama_cpp_on_combining_marks(tmp_path, pre):
    """The two pre-tokenizers differ only in whether combining marks (\\p{M}) join letter runs:
    texts full of marks, with merges that make every word boundary visible in the ids."""
    alphabet = bytes_to_unicode()
    merges = [f"{alphabet[a]} {alphabet[b]}" for a, b in ((0x65, 0xCC), (0x61, 0xCC), (0xCC, 0x81), (0x20, 0xCC), (0x21, 0xCC))]
    tokens = list(alphabet.values()) + [m.replace(" ", "") for m in merges]
    path = write_vocab_gguf(tmp_path / f"{pre}.gguf", tokens, [1] * len(tokens), merges, pre=pre)
    tok = Tokenizer.from_gguf(path)
    for text in MARK_TEXTS:
        assert tok.encode(text) == llama_tokenize(path, text), (pre, text)
    assert split_qwen2("e\u0301te\u0301") == ["e", "\u0301te", "\u0301"] and split_qwen35("e\u0301te\u0301") == ["e\u0301te\u0301"]
