"""What llama-server sends for a greedy run of given ids, as its source does it (tools/server of llama.cpp
vendored in llama-cpp-python 0.3.36; refimpl.oracle.response_align's docstring): ``process_token`` holds back
a token after which ``validate_utf8`` finds the generated text cut inside a UTF-8 character — no entry, no
streamed chunk — and sends its bytes with the next token that completes the text. Used by
tests/test_responses.py to check the reader against every id sequence, beside the recorded real answers."""

from __future__ import annotations

import json

from refimpl.oracle.response_align import validate_utf8


def _entry(tid: int, sent: bytes, lp: float) -> dict:
    return {"id": tid, "token": sent[:validate_utf8(sent)].decode("utf-8", "replace"), "bytes": list(sent),
            "logprob": lp, "top_logprobs": [{"id": tid, "token": "", "bytes": [], "logprob": lp}]}


def run(ids: list[int], piece) -> list[tuple[int, int, bytes | None]]:
    """(id, n_gen, bytes sent with it or None when held back) per token: ``process_token``."""
    text, n_sent, out = b"", 0, []
    for n, t in enumerate(ids, 1):
        text += piece(t)
        if validate_utf8(text) < len(text):
            out.append((t, n, None))
        else:
            out.append((t, n, text[n_sent:]))
            n_sent = len(text)
    return out


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")  # nlohmann's dump with error_handler_t::replace


def completion(ids, piece, logprob=lambda i: -0.5) -> str:
    sent = run(ids, piece)
    cp = [_entry(t, b, logprob(i)) for i, (t, _, b) in enumerate(sent) if b is not None]
    return json.dumps({"index": 0, "content": _text(b"".join(piece(t) for t in ids)), "tokens": list(ids), "stop": True,
                       "tokens_predicted": len(ids), "completion_probabilities": cp})


def completion_stream(ids, piece, logprob=lambda i: -0.5) -> str:
    chunks = [{"index": 0, "content": _text(b), "tokens": [t], "stop": False, "tokens_predicted": n,
               "completion_probabilities": [_entry(t, b, logprob(i))]}
              for i, (t, n, b) in enumerate(run(ids, piece)) if b is not None]
    chunks.append({"index": 0, "content": "", "tokens": [], "stop": True, "tokens_predicted": len(ids)})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)


def v1(ids, piece, logprob=lambda i: -0.5, stream: bool = False) -> str:
    entries = [_entry(t, b, logprob(i)) for i, (t, _, b) in enumerate(run(ids, piece)) if b is not None]
    usage = {"completion_tokens": len(ids), "prompt_tokens": 1, "total_tokens": len(ids) + 1}
    if not stream:
        return json.dumps({"object": "text_completion", "usage": usage, "choices": [
            {"text": _text(b"".join(piece(t) for t in ids)), "index": 0, "logprobs": {"content": entries}, "finish_reason": "length"}]})
    chunks = [{"object": "text_completion", "choices": [{"text": _text(bytes(e["bytes"])), "index": 0,
                                                         "logprobs": {"content": [e]}, "finish_reason": None}]} for e in entries]
    chunks.append({"object": "text_completion", "usage": usage,
                   "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
