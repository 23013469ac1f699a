"""Placing a server answer's log-prob entries on its generated token ids, and recovering the ids it never
names (refimpl.oracle.responses reads the formats; docs/validating-an-engine.md, "3d. Server responses").

Why llama-server leaves entries out — ``tools/server/`` of llama.cpp as vendored in llama-cpp-python 0.3.36:

* ``server-context.cpp``, ``process_token``: each sampled token's piece is appended to ``slot.generated_text``
  and, with ``return_tokens``, its id to ``slot.generated_tokens``. Then ``validate_utf8(slot.generated_text)``
  (``server-common.cpp``) looks at the text's last four bytes: a UTF-8 lead byte among them that announces
  more bytes than follow it makes the text ``incomplete`` (so does a lead byte followed by ASCII, until three
  bytes have passed: the function checks lengths, not continuation bytes). An incomplete token is *held back*:
  ``slot.add_token(result)`` is skipped — it is what pushes the token's ``completion_token_output`` (id,
  ``prob``, the top-``n_probs`` ``probs`` that ``populate_token_probs`` filled) onto
  ``slot.generated_token_probs`` — and so is ``send_partial_response``. The next token that leaves the text
  complete is sent with ``text_to_send`` = every byte since the last one sent, the held-back tokens' first; its
  entry's ``bytes`` (``probs_vector_to_json``, ``server-task.cpp``) carry them. Byte-fallback tokens of a
  byte-level BPE vocabulary (one byte of a CJK character, an emoji, an accented letter) and, on a
  random-weight model, any token ending in a lead byte are held back this way.
* ``/completion``, whole (``send_final_response`` → ``server_task_result_cmpl_final::to_json_non_oaicompat``):
  ``tokens`` is ``generated_tokens`` (every id); ``completion_probabilities`` is ``probs_output``, a copy of
  ``generated_token_probs``: no entry for a held-back token, and none for tokens still held back when
  generation ends (a gap at the end). (With a stop word, ``send_final_response`` also drops as many entries
  at the end as the stop word has tokens.)
* ``/completion``, streamed (``send_partial_response`` → ``server_task_result_cmpl_partial::to_json_non_oaicompat``):
  one chunk per sent token — ``tokens`` [its id], ``content`` and its entry's ``bytes`` = its ``text_to_send``,
  ``tokens_predicted`` = ``slot.stats.n_gen``, which counts every token sampled so far, held back or not. A
  held-back token has no chunk: neither its id nor its log-probs are sent; the next chunk's
  ``tokens_predicted`` jumps by one more per held-back token. The final chunk (``stream``: ``content`` "" and
  ``tokens`` [], no entries) has the total count, so tokens held back at the end are counted and never named.
* ``/v1/completions`` and ``/v1/chat/completions``, whole or streamed (``to_json_oaicompat`` of the final and
  the partial result): no ``tokens``; ``logprobs.content`` is ``probs_output`` (whole) or the chunk's one
  ``prob_output`` (streamed), so a held-back token has neither an id nor an entry; ``usage.completion_tokens``
  (``n_decoded``) counts every token.
* ``--spec-type draft-mtp``: tokens accepted in the speculative loop get ``prob = 1.0`` and no ``probs`` (its
  "TODO: set result.probs"): whole, an entry with log-prob 0.0 and no top-k (refimpl.oracle.probs lists those);
  streamed, a chunk without ``completion_probabilities`` (``prob_output.probs`` is empty).

What the reader does with it:

* **Every id given** (``/completion``'s ``tokens``, vLLM's ``token_ids``): :func:`align_entries` places the
  entries on the ids in order, by id, as a subsequence. Where more than one placement fits (a token repeated
  around a gap), the one whose gaps are exactly the held-back steps that :func:`partial_steps` computes from
  the oracle's tokenizer is taken; no placement, or several and none of them that one, is refused in one line
  naming the first step that cannot be placed.
* **Only the entries name ids** (the streamed and OpenAI forms): :func:`recover` takes each entry's ``bytes``
  minus the token's own piece (the oracle's tokenizer) as the bytes of the tokens held back before it, and
  splits them into vocabulary pieces such that the text after each piece still ends inside a UTF-8 character
  (``validate_utf8`` as above) — in exactly as many tokens as ``tokens_predicted`` says, where it says. One
  split: its ids are the held-back tokens (no log-prob: "partial UTF-8"). No split, or several (e.g. the first
  three bytes of an emoji as 1+2 or 2+1 bytes when both are tokens), is refused in one line naming the step.
  Without a count per run (``/v1``), the one combination of splits whose token count makes up the server's
  total is taken. A token that renders no bytes (a control or unused token: :attr:`Pieces.hidden`) can be held
  back inside a run without a trace in the bytes, so wherever such tokens could make up a count (a count above
  the pieces, a coarser split below it, a ``/v1`` answer with a run and a shortfall) the answer is refused too:
  which tokens they were is not in it. Tokens counted (``tokens_predicted``, ``usage.completion_tokens``)
  after the last one the answer sends bytes for are *unread*: reported, not audited. Without the oracle's
  tokenizer, an answer that leaves ids out is refused in one line. tests/server_sim.py replays these rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.errors import RefimplError

PARTIAL_UTF8 = "partial UTF-8"  # after the token the text ends inside a UTF-8 character: held back, no entry
NOT_GIVEN = "not given"  # no log-prob for the token, cause unknown


def validate_utf8(text: bytes) -> int:
    """``validate_utf8`` of ``server-common.cpp``: the length of ``text`` without a multi-byte character cut
    off at its end, judged from the last four bytes (a lead byte announcing more bytes than follow it)."""
    n = len(text)
    for i in range(1, min(4, n) + 1):
        c = text[n - i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or ((c & 0xF8) == 0xF0 and i < 4):
            return n - i
    return n


def ends_inside_char(text: bytes) -> bool:
    """Whether llama-server holds back a token after which the generated text is ``text``."""
    return validate_utf8(text) < len(text)


@dataclass(frozen=True)
class Sent:
    """One token as an answer names it."""

    id: int
    probs: object  # refimpl.oracle.responses.StepProbs or None (no entry)
    raw: bytes | None = None  # the bytes sent with it: those of the tokens held back before it, then its own
    held: int | None = None  # tokens sampled before it and not sent (a count says so); None: no count


class Pieces:
    """The oracle's tokenizer as llama-server renders tokens (``common_token_to_piece``: control tokens as
    nothing, unless the server was started with ``--special``), and the reverse: the ids whose piece is a
    given byte string."""

    def __init__(self, tokenizer, where: str = "the response"):
        self.tok = tokenizer
        self.where = where  # for the one-line refusal of an id outside the vocabulary
        self._texts = None  # GGUF token text → id, built at the first reverse lookup
        self._hidden = None

    def piece(self, tid: int) -> bytes:
        self._check(tid)
        return self.tok.piece(tid, special=False)

    def _check(self, tid: int) -> None:
        if not 0 <= tid < self.tok.n_vocab:
            raise RefimplError(f"{self.where}: token id {tid}, outside the vocabulary [0, {self.tok.n_vocab})")

    def own(self, tid: int, raw: bytes) -> bytes | None:
        """The piece of ``tid`` that ``raw`` ends with (``--special``'s rendering of a control token, else the
        plain one, which is empty for it), or None."""
        self._check(tid)
        for special in (True, False):
            p = self.tok.piece(tid, special=special)
            if raw.endswith(p):
                return p
        return None

    def ids_of(self, piece: bytes) -> list[int]:
        """Every id whose piece is ``piece``: a normal token's text is its bytes in GPT-2's alphabet, a
        user-defined token's its text, a byte-fallback token's ``<0xXX>``."""
        from refimpl.tokenizer import bytes_to_unicode

        if self._texts is None:
            self._texts = {text: i for i, text in enumerate(self.tok.tokens)}
        texts = self._texts
        alphabet = bytes_to_unicode()
        cands = {texts.get("".join(alphabet[b] for b in piece)), texts.get(f"<0x{piece[0]:02X}>") if len(piece) == 1 else None}
        try:
            cands.add(texts.get(piece.decode("utf-8")))
        except UnicodeDecodeError:
            pass
        return sorted(t for t in cands if t is not None and self.piece(t) == piece)

    def partial_steps(self, ids) -> set[int]:
        """The steps after which the generated text ends inside a UTF-8 character (:func:`validate_utf8`):
        the tokens llama-server holds back."""
        out, tail = set(), b""
        for step, t in enumerate(ids):
            tail = (tail + self.piece(t))[-4:]
            if ends_inside_char(tail):
                out.add(step)
        return out

    @property
    def hidden(self) -> list[int]:
        """The ids that render no bytes (control and unused tokens) and do not end generation: a run of held-back
        tokens may hold them without a trace in the bytes."""
        if self._hidden is None:
            eog = set(getattr(self.tok, "eog_ids", ()))
            self._hidden = [t for t in range(self.tok.n_vocab) if t not in eog and not self.piece(t)]
        return self._hidden

    def splits(self, held: bytes, tail: bytes, most: int | None, limit: int = 2) -> list[list[int]]:
        """Up to ``limit`` ways to cut ``held`` (sent after text ending in ``tail``) into the pieces of at most
        ``most`` tokens (any number: None), each leaving the text inside a UTF-8 character."""
        out: list[list[int]] = []
        dead = set()  # (pos, tail, tokens so far when counted) from which no split ends: each tried once

        def walk(pos: int, tail: bytes, acc: list[int]) -> None:
            state = (pos, tail, len(acc) if most is not None else None)
            if len(out) >= limit or state in dead:
                return
            before = len(out)
            if pos == len(held):
                out.append(acc)
            elif most is None or len(acc) < most:
                for end in range(pos + 1, len(held) + 1):
                    nxt = (tail + held[pos:end])[-4:]
                    if ends_inside_char(nxt):
                        for t in self.ids_of(held[pos:end]):
                            walk(end, nxt, acc + [t])
            if len(out) == before:
                dead.add(state)

        walk(0, tail[-4:], [])
        return out


def _show(b: bytes) -> str:
    return repr(b if len(b) <= 24 else b[:24] + b"...")


def align_entries(ids: list[int], entries: list, pieces: Pieces | None, where: str, first: int = 0) -> list:
    """Each step's StepProbs (None: no entry), the entries ``[(id, StepProbs)]`` placed on ``ids`` in order
    and by id (module docstring); a placement that does not exist or is not unique is one line naming the
    step (``first``: the step of ``ids[0]``)."""
    eids = [e[0] for e in entries]
    if eids == ids:
        return [e[1] for e in entries]
    left, j = [], 0
    for k, e in enumerate(eids):
        while j < len(ids) and ids[j] != e:
            j += 1
        if j == len(ids):
            step = left[-1] + 1 if left else 0
            here = f"'tokens' has {ids[step]} there" if step < len(ids) else "'tokens' ends there"
            raise RefimplError(f"{where}: 'tokens' and the ids of the log-prob entries disagree: step {first + step} cannot be "
                               f"aligned (log-prob entry {k} names id {e}, which no token from step {first + step} on is; {here})")
        left.append(j)
        j += 1
    right, j = [], len(ids) - 1
    for e in reversed(eids):
        while ids[j] != e:
            j -= 1
        right.append(j)
        j -= 1
    right.reverse()
    place = left
    if left != right:
        gaps = pieces.partial_steps(ids) if pieces is not None else None
        kept = [s for s in range(len(ids)) if gaps is not None and s not in gaps]
        if gaps is None or [ids[s] for s in kept] != eids:
            step = next(a for a, b in zip(left, right) if a != b)
            need = "; give MODEL: its tokenizer tells which tokens llama-server held back" if pieces is None else ""
            raise RefimplError(f"{where}: the log-prob entries fit 'tokens' in more than one way from step {first + step} on "
                               f"(a token repeats around a step without an entry){need}")
        place = kept
    steps = [None] * len(ids)
    for s, e in zip(place, entries):
        steps[s] = e[1]
    return steps


WAYS = 8  # splits of one run of held-back bytes considered; more is refused as ambiguous
COMBOS = 4096  # combinations of the ambiguous runs' splits tried against the server's count


def _gap_error(where: str, step: int, tid: int, held: bytes, count: int | None, why: str) -> RefimplError:
    n = f"{count} held-back token(s)" if count is not None else "the held-back tokens"
    return RefimplError(f"{where}: step {step} cannot be aligned: the bytes {_show(held)} sent before token {tid}, {n}, {why}; "
                        "ask for the whole /completion answer, whose 'tokens' names every id")


NO_WAY = "split in no way into pieces that each leave the text inside a UTF-8 character"
TWO_WAYS = "split in more than one way into pieces that each leave the text inside a UTF-8 character"
HIDDEN = "may hold tokens that render no bytes (control or unused tokens), which the bytes do not name"


def recover(units: list[Sent], total: int | None, pieces: Pieces | None, where: str, text: str | None = None):
    """An answer whose entries are the only ids → (ids, each step's StepProbs or None, the steps whose ids were
    recovered from the bytes, the unread count); module docstring. ``total``: the tokens the server counts
    (``tokens_predicted``, ``usage.completion_tokens``), None when it does not say; ``text``: a whole answer's
    text (``content``, ``text``), which tells whether any token was held back at the end (it has bytes after
    the last ones sent). A split must be the only one that fits: with a count per run of held-back bytes
    (``tokens_predicted``), the only one with that many pieces; without, the only combination of splits whose
    token count makes up the server's. A token that renders no bytes (:attr:`Pieces.hidden`) can be held back
    inside a run without a trace, so a count that a coarser split plus such tokens would also make up is
    ambiguous too."""
    if pieces is None:
        held = next((k for k, u in enumerate(units) if u.held), None)
        if held is not None:
            raise RefimplError(f"{where}: {units[held].held} token(s) before step {held} were generated and not sent "
                               "(tokens_predicted); give MODEL: its tokenizer recovers their ids from the bytes sent after them")
        if total is not None and total > len(units):
            raise RefimplError(f"{where}: the server counts {total} generated tokens and names {len(units)}; give MODEL: its "
                               "tokenizer recovers the ids held back from the bytes sent after them")
        return [u.id for u in units], [u.probs for u in units], (), 0
    ways, free, helds, tail, blind, step = [], [], [], b"", False, 0  # per unit: the splits of the bytes held back before it
    for u in units:
        held, found = b"", [[]]
        if u.raw is None:
            if u.held:
                raise RefimplError(f"{where}: step {step} cannot be aligned: {u.held} token(s) before it were generated and not "
                                   "sent (tokens_predicted), and the answer gives no bytes to recover their ids from")
            blind, own = True, pieces.piece(u.id)
        else:
            own = pieces.own(u.id, u.raw)
            if own is None:
                raise RefimplError(f"{where}: step {step} cannot be aligned: the bytes sent with token {u.id}, {_show(u.raw)}, "
                                   f"do not end with its piece {_show(pieces.piece(u.id))}")
            held = u.raw[:len(u.raw) - len(own)]
        if held or u.held:
            found = pieces.splits(held, tail, u.held, WAYS + 1)
            if u.held is not None:  # the count says how many pieces
                if pieces.hidden and any(len(f) < u.held for f in found):
                    raise _gap_error(where, step, u.id, held, u.held, HIDDEN)
                found = [f for f in found if len(f) == u.held]
            if len(found) != 1 and (u.held is not None or not found or len(found) > WAYS):
                raise _gap_error(where, step, u.id, held, u.held, TWO_WAYS if found else NO_WAY)
        ways.append(found)
        free.append(bool(held) and u.held is None)
        helds.append(held)
        tail = (tail + held + own)[-4:]
        step += len(found[0]) + 1
    sent = b"".join(u.raw for u in units) if not blind else None
    exact = text is not None and sent is not None and text == sent.decode("utf-8", "replace")  # nothing held at the end
    choice = _choose(ways, free, helds, units, total, exact, pieces, where)
    ids, steps, recovered = [], [], []
    for u, split in zip(units, choice):
        for t in split:
            recovered.append(len(ids))
            ids.append(t)
            steps.append(None)
        ids.append(u.id)
        steps.append(u.probs)
    unread = total - len(ids) if total is not None and total > len(ids) else 0
    if unread and blind:
        raise RefimplError(f"{where}: the server counts {total} generated tokens and names {len(ids)}; the answer gives no bytes "
                           "to tell where the others were held back")
    return ids, steps, tuple(recovered), unread


def _choose(ways: list, free: list, helds: list, units: list[Sent], total: int | None, exact: bool, pieces: Pieces,
            where: str) -> list:
    """One split per unit: the only combination whose token count makes up ``total`` (all of it when ``exact``:
    nothing was held back at the end; at most it otherwise, the rest unread). Where runs without a count of
    their own (``free``) might hold tokens that render no bytes, only a combination that makes up all of
    ``total``, with none below it, is taken."""
    import itertools
    import math

    open_ = [k for k, w in enumerate(ways) if len(w) > 1]
    hide = bool(pieces.hidden) and any(free)
    if not open_ and not hide:
        return [w[0] for w in ways]
    fixed = len(units) + sum(len(w[0]) for w in ways if len(w) == 1)
    fits, below = [], False
    if total is not None and math.prod(len(ways[k]) for k in open_) <= COMBOS:
        for combo in itertools.product(*(ways[k] for k in open_)):
            n = fixed + sum(map(len, combo))
            below = below or n < total
            if n == total or (n < total and not exact and not hide):
                fits.append(combo)
    if len(fits) != 1 or (hide and below):
        k = open_[0] if open_ and len(fits) != 1 else free.index(True)  # the first run that is not decided
        why = HIDDEN if hide and below else TWO_WAYS if fits or total is None else NO_WAY + " that the count allows"
        raise _gap_error(where, k + sum(len(w[0]) for w in ways[:k]), units[k].id, helds[k], units[k].held, why)
    choice = [w[0] for w in ways]
    for k, split in zip(open_, fits[0]):
        choice[k] = list(split)
    return choice


def missing_reasons(ids: list[int], steps: list, pieces: Pieces | None) -> tuple:
    """((step, reason), …) for each step without the chosen token's log-prob: :data:`PARTIAL_UTF8` for a step
    without an entry whose token leaves the text inside a UTF-8 character (the oracle's tokenizer), else
    :data:`NOT_GIVEN`."""
    partial = pieces.partial_steps(ids) if pieces is not None else set()
    return tuple((s, PARTIAL_UTF8 if sp is None and s in partial else NOT_GIVEN)
                 for s, sp in enumerate(steps) if sp is None or sp.logprob is None)
