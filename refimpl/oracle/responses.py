"""An inference server's response as a stream: the generated ids, the prompt when echoed, and the
per-token log-probabilities when the response carries them (docs/validating-an-engine.md,
"Server responses"). :func:`refimpl.oracle.audit.read_stream` calls :func:`read_response` when a
file's content is one of

* llama-server's ``/completion`` (``tools/server/server-task.cpp`` of llama.cpp as vendored in
  llama-cpp-python 0.3.36): one JSON object (``to_json_non_oaicompat``: ``tokens``, with
  ``n_probs`` ``completion_probabilities`` — per token ``id``, ``logprob``, ``top_logprobs`` of
  ``{id, logprob}`` — ``prompt`` (the prompt detokenized) and ``timings``, with ``draft_n`` /
  ``draft_n_accepted`` when it drafted); or the streamed chunks (``stream: true``) as SSE
  ``data: {...}`` lines or one JSON object per line, each chunk with its ``tokens`` and
  ``completion_probabilities``;
* an OpenAI-style completion or chat completion, whole or streamed (``choices[0]``): llama-server's
  ``/v1/completions`` and ``/v1/chat/completions`` (``logprobs.content`` entries carry ``id``);
  vLLM's with ``return_tokens_as_token_ids`` (a token is ``"token_id:123"``; chat
  ``logprobs.content`` or legacy ``logprobs.tokens`` / ``token_logprobs`` / ``top_logprobs``
  dicts) and ``return_token_ids`` (``choices[i].token_ids``, ``prompt_token_ids``).

Probabilities requested after sampling (llama-server's ``post_sampling_probs``: ``prob`` /
``top_probs``) are not the model's distribution: the ids are read, the probabilities are not compared.

llama-server sends no entry — and, streamed or through ``/v1``, no id — for a token whose bytes end inside a
UTF-8 character (it holds the token's text back): :mod:`refimpl.oracle.response_align` says where in its
source and how the reader places the entries on the ids by position and id, recovers the ids held back from
the bytes sent after them (with the oracle's tokenizer), and which answers it refuses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from refimpl.errors import RefimplError
from refimpl.oracle.response_align import Pieces, Sent, align_entries, missing_reasons, recover

LOWEST = -1e30  # llama-server writes FLT_LOWEST (-3.4e38) for a probability of 0 (logarithm(), server-task.cpp)


@dataclass(frozen=True)
class StepProbs:
    """The engine's log-probabilities at one generated step."""

    logprob: float | None  # the chosen token's (-inf: probability 0); None: not given
    top: tuple  # ((id, logprob), …): the top-k entries that name a token id


@dataclass(frozen=True)
class ResponseInfo:
    format: str  # e.g. "llama-server /completion", "openai chat, streamed"
    probs: tuple | None  # StepProbs or None per generated token; None: no log-probs in the response
    post_sampling: bool = False  # probabilities after the sampler chain: not compared
    draft_n: int | None = None  # timings.draft_n / draft_n_accepted (llama-server, when it drafted)
    draft_n_accepted: int | None = None
    prompt_text: str | None = None  # the prompt as the response echoes it (llama-server: detokenized)
    missing: tuple = ()  # ((step, reason), …): the steps of probs without the chosen token's log-prob (response_align)
    recovered: tuple = ()  # steps whose ids the answer does not name, recovered from the bytes sent after them
    unread: int = 0  # tokens the server counts after the last one it sends anything for: not audited


def looks_like_response(text: str) -> bool:
    """Whether ``text`` is a server response (SSE, JSON lines or one JSON object of a known shape)."""
    head = text.lstrip()
    if head.startswith("event:") or (head.startswith("data:") and head[5:].lstrip().startswith(("{", "[DONE]"))):
        return True
    if not head.startswith(("{", "[")):
        return False
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return head.startswith("{") and exc.msg == "Extra data"  # JSON lines
    if isinstance(obj, list):
        return bool(obj) and all(isinstance(o, dict) for o in obj)
    return isinstance(obj, dict) and (_is_response_object(obj) or set(obj) == {"error"})


def _is_response_object(obj: dict) -> bool:
    return ("choices" in obj or "completion_probabilities" in obj
            or ("tokens" in obj and any(k in obj for k in ("id_slot", "tokens_predicted", "content", "stop"))))


def _objects(text: str, where: str) -> tuple[list[dict], bool]:
    """The response's JSON objects, and whether it came as a stream of chunks."""
    head = text.lstrip()
    if head.startswith(("data:", "event:")):
        objs = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line.startswith("data:"):
                if line and not line.startswith((":", "event:", "id:", "retry:")):
                    raise RefimplError(f"{where}: line {n} of the event stream is neither 'data: …' nor an SSE field")
                continue
            body = line[5:].strip()
            if body == "[DONE]" or not body:
                continue
            objs.append(_load(body, f"{where}: line {n}"))
        return objs, True
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise RefimplError(f"{where}: looks like JSON but does not parse ({exc.msg}, line {exc.lineno})") from None
        return [_load(line, f"{where}: line {n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()], True
    if isinstance(obj, list):
        return obj, True
    return [obj], False


def _load(body: str, where: str) -> dict:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise RefimplError(f"{where}: does not parse as JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise RefimplError(f"{where}: a response chunk must be a JSON object")
    return obj


def _int_id(value, where: str) -> int | None:
    """A token id: an integer, or vLLM's "token_id:123"; None for a token given as text."""
    if isinstance(value, bool):
        raise RefimplError(f"{where}: a token id must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.startswith("token_id:"):
        try:
            return int(value[9:])
        except ValueError:
            raise RefimplError(f"{where}: {value!r} is not 'token_id:N'") from None
    if isinstance(value, str):
        return None
    raise RefimplError(f"{where}: a token must be an id or a string, got {type(value).__name__}")


def _logprob(value, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-6:
        raise RefimplError(f"{where}: a log-probability must be a number ≤ 0, got {value!r}")
    return -math.inf if value <= LOWEST else min(float(value), 0.0)


def _ids_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RefimplError(f"{where}: expected a list of integer token ids")
    return list(value)


def _raw(value, where: str) -> bytes | None:
    """An entry's ``bytes`` (llama-server: the text sent with the token, held-back bytes included)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in value):
        raise RefimplError(f"{where}: 'bytes' must be a list of byte values 0..255")
    return bytes(value)


def _entry(e, where: str, post: bool) -> tuple[int | None, StepProbs, bytes | None]:
    """One ``completion_probabilities`` / ``logprobs.content`` entry → (id, StepProbs, bytes or None)."""
    if not isinstance(e, dict):
        raise RefimplError(f"{where}: a log-prob entry must be an object")
    tok = _int_id(e["id"], f"{where} 'id'") if "id" in e else _int_id(e.get("token"), f"{where} 'token'")
    lp = None if post else _logprob(e.get("logprob"), f"{where} 'logprob'")
    top_raw = e.get("top_probs" if post else "top_logprobs") or []
    if not isinstance(top_raw, list):
        raise RefimplError(f"{where}: 'top_logprobs' must be a list")
    top = []
    for j, t in enumerate(top_raw):
        if not isinstance(t, dict):
            raise RefimplError(f"{where}: top_logprobs[{j}] must be an object")
        tid = _int_id(t["id"], f"{where} top_logprobs[{j}]") if "id" in t else _int_id(t.get("token"), f"{where} top_logprobs[{j}]")
        tlp = None if post else _logprob(t.get("logprob"), f"{where} top_logprobs[{j}]")
        if tid is not None and tlp is not None:
            top.append((tid, tlp))
    return tok, StepProbs(lp, tuple(top)), _raw(e.get("bytes"), f"{where} 'bytes'")


def _legacy(lp: dict, where: str) -> list:
    """OpenAI legacy completion ``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs`` dicts → entries."""
    toks, lps, tops = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    if not all(isinstance(x, list) for x in (toks, lps, tops)):
        raise RefimplError(f"{where}: logprobs.tokens / token_logprobs / top_logprobs must be lists")
    entries = []
    for i, t in enumerate(toks):
        top_d = tops[i] if i < len(tops) else None
        if top_d is not None and not isinstance(top_d, dict):
            raise RefimplError(f"{where}: logprobs.top_logprobs[{i}] must be an object or null")
        top = tuple((tid, v) for k, x in (top_d or {}).items()
                    if (tid := _int_id(k, f"{where} top_logprobs[{i}]")) is not None
                    and (v := _logprob(x, f"{where} top_logprobs[{i}]")) is not None)
        lp_i = _logprob(lps[i] if i < len(lps) else None, f"{where} token_logprobs[{i}]")
        entries.append((_int_id(t, f"{where} logprobs.tokens[{i}]"), StepProbs(lp_i, top), None))
    return entries


def _choice(obj: dict, where: str) -> dict | None:
    choices = obj["choices"]
    if not isinstance(choices, list):
        raise RefimplError(f"{where}: 'choices' must be a list")
    if not choices:
        return None  # a usage-only chunk
    if len(choices) > 1:
        raise RefimplError(f"{where}: the response holds {len(choices)} choices; audit one completion at a time (n=1)")
    if not isinstance(choices[0], dict):
        raise RefimplError(f"{where}: choices[0] must be an object")
    return choices[0]


@dataclass
class _Part:
    """What one response object or chunk says."""

    kind: str
    ids: list | None  # every id it generated, named outright ('tokens', vLLM's token_ids); None: only its entries name ids
    entries: list  # [(id, StepProbs, bytes or None)]: its log-prob entries, in order
    has: bool = False  # it carries log-probs
    text: str | None = None  # the text it sends (content, text, delta.content)
    count: int | None = None  # llama-server's tokens_predicted: tokens sampled so far, sent or held back
    total: int | None = None  # usage.completion_tokens


def _count(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RefimplError(f"{where} must be a count ≥ 0, got {json.dumps(value)[:40]}")
    return value


def _one(obj: dict, where: str, post: bool) -> _Part:
    """One response object or chunk → :class:`_Part`."""
    if "choices" in obj:
        usage = obj.get("usage")
        total = _count(usage.get("completion_tokens"), f"{where}: usage.completion_tokens") if isinstance(usage, dict) else None
        c = _choice(obj, where)
        if c is None:
            return _Part("openai", None, [], total=total)
        kind = "openai chat" if ("message" in c or "delta" in c) else "openai completion"
        lp = c.get("logprobs")
        entries, has = [], False
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            entries = [_entry(e, f"{where} logprobs.content[{i}]", post) for i, e in enumerate(lp["content"])]
            has = True
        elif isinstance(lp, dict) and "tokens" in lp:
            entries, has = _legacy(lp, where), True
        elif lp is not None and not isinstance(lp, dict):
            raise RefimplError(f"{where}: 'logprobs' must be an object or null")
        ids = None
        if c.get("token_ids") is not None:  # vLLM return_token_ids
            ids = _ids_list(c["token_ids"], f"{where}: token_ids")
            if any(tok is None for tok, _, _ in entries):  # entries that name text: placed by position, or not at all
                entries = [(t, sp, raw) for t, (_, sp, raw) in zip(ids, entries)] if len(entries) == len(ids) else []
                has = has and bool(entries)
        elif any(tok is None for tok, _, _ in entries):
            raise RefimplError(f"{where}: the log-prob tokens are text, not ids: request ids (vLLM: return_tokens_as_token_ids "
                               "or return_token_ids; llama-server's /v1 endpoints give 'id')")
        msg = c.get("delta") or c.get("message") or {}
        if not isinstance(msg, dict):
            raise RefimplError(f"{where}: choices[0].delta / message must be an object")
        text = c.get("text") if "text" in c else msg.get("content")
        if text and not entries and not ids:
            raise RefimplError(f"{where}: the response has text but no token ids: request log-probs with ids "
                               "(logprobs; vLLM: return_tokens_as_token_ids or return_token_ids)")
        return _Part(kind, ids, entries, has, text if isinstance(text, str) else None, total=total)
    # llama-server /completion
    toks = obj.get("tokens") if obj.get("tokens") is not None else []
    toks = _ids_list(toks, f"{where}: 'tokens'")
    count = _count(obj.get("tokens_predicted"), f"{where}: 'tokens_predicted'")
    text = obj.get("content") if isinstance(obj.get("content"), str) else None
    cp = obj.get("completion_probabilities")
    if cp is None:
        if obj.get("content") and not toks:
            raise RefimplError(f"{where}: the response has content but no token ids: request \"return_tokens\": true or n_probs")
        return _Part("llama-server /completion", toks or None, [], False, text, count)
    if not isinstance(cp, list):
        raise RefimplError(f"{where}: 'completion_probabilities' must be a list")
    entries = [_entry(e, f"{where} completion_probabilities[{i}]", post) for i, e in enumerate(cp)]
    if any(tok is None for tok, _, _ in entries):
        raise RefimplError(f"{where}: a completion_probabilities entry has no integer 'id'")
    return _Part("llama-server /completion", toks or None, entries, True, text, count)


def _placed(ids: list[int], entries: list, pieces, where: str, first: int = 0) -> list:
    """Each of ``ids``' StepProbs or None: the entries placed on them (response_align.align_entries; ``first``:
    the step of ``ids[0]``)."""
    return align_entries(ids, [(t, sp) for t, sp, _ in entries], pieces, where, first) if entries else [None] * len(ids)


def _lossless(text: str | None) -> bytes | None:
    """A chunk's text as the bytes the server sent, unless JSON replaced invalid bytes (U+FFFD)."""
    return None if text is None or "\ufffd" in text else text.encode("utf-8")


def _chunk_units(parts: list[_Part], pieces, where: str) -> tuple[list[Sent], int | None]:
    """A streamed answer's tokens in order (:class:`Sent`) and the count the server gives, if any."""
    units, before, total = [], 0, None
    for i, p in enumerate(parts):
        w = f"{where}: chunk {i}"
        if p.total is not None:
            total = p.total
        if p.ids is None:  # OpenAI forms; a /completion chunk without 'tokens' (its entries name the ids)
            units += [Sent(t, sp, raw) for t, sp, raw in p.entries]
            if p.count is not None:
                total = max(p.count, total or 0)
            continue
        first = p.count - len(p.ids) if p.count is not None and p.count >= len(p.ids) else len(units)
        steps = _placed(p.ids, p.entries, pieces, w, first)
        raw = p.entries[0][2] if p.entries and p.entries[0][0] == p.ids[0] else None
        raw = raw if raw is not None else _lossless(p.text)
        held = None
        if p.count is not None:
            held = p.count - before - len(p.ids) if before is not None else None
            if held is not None and held < 0:
                raise RefimplError(f"{w}: 'tokens_predicted' {p.count} counts fewer tokens than the chunks so far give")
            total = max(p.count, total or 0)
        before = p.count
        if len(p.ids) > 1:  # one chunk, several tokens: its text covers them all
            raw = None
        units += [Sent(t, sp, raw if j == 0 else None, held if j == 0 else 0) for j, (t, sp) in enumerate(zip(p.ids, steps))]
    return units, total


def _prompt(obj: dict, where: str) -> tuple[list[int] | None, str | None]:
    choices = obj.get("choices")
    for holder in (obj, *(choices[:1] if isinstance(choices, list) else [])):
        if isinstance(holder, dict) and holder.get("prompt_token_ids") is not None:
            return _ids_list(holder["prompt_token_ids"], f"{where}: 'prompt_token_ids'"), None
    p = obj.get("prompt")
    if isinstance(p, list):
        return _ids_list(p, f"{where}: 'prompt'"), None
    return None, p if isinstance(p, str) and p else None


def read_response(text: str, where: str, tokenizer=None) -> tuple[list[int], list[int] | None, ResponseInfo]:
    """A server response (module docstring) → (generated ids, prompt ids or None, :class:`ResponseInfo`).
    ``tokenizer``: the oracle's (refimpl.tokenizer.Tokenizer), which places entries around the tokens llama-server
    held back and recovers the ids it did not send (refimpl.oracle.response_align); None: an answer that leaves
    ids out is refused in one line."""
    objs, chunked = _objects(text, where)
    if not objs:
        raise RefimplError(f"{where}: the response holds no JSON objects")
    for i, o in enumerate(objs):
        if not isinstance(o, dict):
            raise RefimplError(f"{where}: response chunk {i} is not a JSON object")
        if "error" in o and not _is_response_object(o):
            raise RefimplError(f"{where}: the server answered with an error: {json.dumps(o['error'])[:200]}")
        if not (_is_response_object(o) or "tokens" in o):
            raise RefimplError(f"{where}: chunk {i} is not a /completion or OpenAI-style response (no 'tokens', "
                               "'completion_probabilities' or 'choices')")
    bad = next((i for i, o in enumerate(objs) if "choices" not in o and o.get("index") is not None
                and (not isinstance(o["index"], int) or isinstance(o["index"], bool))), None)
    if bad is not None:
        raise RefimplError(f"{where}: chunk {bad}: 'index' is {json.dumps(objs[bad]['index'])[:80]}, not a completion number")
    indexes = {o.get("index") for o in objs if "choices" not in o and o.get("index") is not None}
    if len(indexes) > 1:
        raise RefimplError(f"{where}: the response holds {len(indexes)} completions (index {sorted(indexes)}); audit one at a time")
    post = any(o.get("generation_settings", {}).get("post_sampling_probs") is True for o in objs if isinstance(o.get("generation_settings"), dict))
    post = post or any(isinstance(e, dict) and "top_probs" in e for o in objs
                       if isinstance(o.get("completion_probabilities"), list) for e in o["completion_probabilities"])
    parts = []
    prompt, prompt_text, draft_n, draft_acc = None, None, None, None
    for i, o in enumerate(objs):
        w = f"{where}: chunk {i}" if chunked else where
        parts.append(_one(o, w, post))
        p, ptext = _prompt(o, w)
        prompt, prompt_text = p if p is not None else prompt, ptext if ptext is not None else prompt_text
        timings = o.get("timings")
        if isinstance(timings, dict) and "draft_n" in timings:
            draft_n, draft_acc = timings.get("draft_n"), timings.get("draft_n_accepted")
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (draft_n, draft_acc)):
                raise RefimplError(f"{w}: timings.draft_n / draft_n_accepted must be integers")
    if not any(p.ids or p.entries for p in parts):
        counted = max((n for p in parts for n in (p.count, p.total) if n is not None), default=0)
        raise RefimplError(f"{where}: the response holds no generated token ids" + (
            f" (the server counts {counted}, all held back: llama-server sends no id for tokens whose bytes end inside a "
            "UTF-8 character; ask for the whole /completion answer, whose 'tokens' names every id)" if counted else ""))
    pieces = Pieces(tokenizer, where) if tokenizer is not None else None
    recovered, unread = (), 0
    if not chunked and parts[0].ids is not None:  # every id named: the entries placed on them
        ids, steps = parts[0].ids, _placed(parts[0].ids, parts[0].entries, pieces, where)
    else:
        whole = None if chunked else parts[0]
        units, total = _chunk_units(parts, pieces, where) if chunked else (
            [Sent(t, sp, raw) for t, sp, raw in whole.entries], whole.count if whole.total is None else whole.total)
        ids, steps, recovered, unread = recover(units, total, pieces, where, whole.text if whole is not None else None)
    has = any(p.has for p in parts) and not post
    kind = next((p.kind for p in parts if p.kind != "openai"), "openai")
    fmt = kind + (", streamed" if chunked else "")
    return ids, prompt, ResponseInfo(fmt, tuple(steps) if has else None, post, draft_n, draft_acc, prompt_text,
                                     missing_reasons(ids, steps, pieces) if has else (), recovered, unread)
