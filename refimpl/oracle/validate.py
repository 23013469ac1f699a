"""``refimpl validate``: drive running llama-server endpoints with a prompt suite and audit what they answer
(docs/validating-an-engine.md, §3e).

For each server (one per draft setting: llama-server configures speculative decoding when it starts):

1. Identity (:func:`server_identity`, :func:`model_mismatches`): ``GET /v1/models`` (llama-server's
   ``meta``: ``n_vocab``, ``n_embd``, ``n_ctx_train``), ``GET /props`` (``model_path``) and ``POST /tokenize``
   of a probe text. A server whose vocabulary size, embedding width, training context or tokenization of
   the probe differs from MODEL's cannot serve the same file: refused in one line before any prompt is sent.
2. Per prompt: ``POST /completion`` with the prompt as token ids (no tokenizer of the server is involved),
   greedy (``temperature`` 0), ``n_probs`` (the top-k log-probs, refimpl.oracle.probs) and ``return_tokens``;
   with ``drafts``, also llama-server's per-request ``speculative.n_max`` (server-schema.cpp).
3. The response is read by :func:`refimpl.oracle.responses.read_response` and audited against the oracle
   (:func:`refimpl.oracle.audit.audit`: the ids, and the log-probs' ``probs:`` verdict).

Network: HTTP to the URLs given, nothing else; every request is bounded by ``timeout`` seconds.
"""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from refimpl.errors import RefimplError

#: The probe text whose tokenization the server and the oracle must agree on (ASCII words, digits, a
#: space run: what any two tokenizers of different files are unlikely to split the same way).
PROBE = "And it came to pass, 12 days  later: Hello world!"
N_PROBS = 5  # top-k log-probs requested per token


def check_url(url: str) -> str:
    """``url`` without a trailing ``/`` when it is ``http(s)://HOST[:PORT][/PATH]``; else one line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefimplError(f"--server {url}: expected a URL http://HOST:PORT (a llama-server), e.g. http://127.0.0.1:8080")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise RefimplError(f"--server {url}: the port is not a number in [0, 65535]") from None
    return url.rstrip("/")


def parse_drafts(text: str) -> list[int]:
    """``--draft 1,3`` → [1, 3] (each ≥ 0, no repeats)."""
    out = []
    for word in text.split(","):
        try:
            n = int(word.strip())
        except ValueError:
            raise RefimplError(f"--draft {text}: expected comma-separated draft lengths, e.g. 1,3") from None
        if n < 0:
            raise RefimplError(f"--draft {text}: a draft length must be ≥ 0, got {n}")
        if n in out:
            raise RefimplError(f"--draft {text}: {n} is given twice")
        out.append(n)
    return out


def http(url: str, body: dict | None, timeout: float, *, missing_ok: bool = False) -> bytes | None:
    """GET (``body`` None) or POST JSON to ``url`` → the answer's bytes; ``missing_ok``: None for a 404 / 405 /
    501 (an endpoint this server does not have). Any failure is one line (:class:`RefimplError`)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as exc:
        if missing_ok and exc.code in (404, 405, 501):
            return None
        detail = exc.read()[:200].decode("utf-8", "replace").strip() if exc.fp else ""
        raise RefimplError(f"{url}: the server answered HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")) from None
    except (TimeoutError, socket.timeout):
        raise RefimplError(f"{url}: no answer within {timeout:g} s (--timeout)") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise RefimplError(f"{url}: no answer within {timeout:g} s (--timeout)") from None
        raise RefimplError(f"{url}: cannot reach the server ({getattr(reason, 'strerror', None) or reason})") from None
    except (ConnectionError, OSError) as exc:  # reset, refused mid-answer, a closed connection (http.client)
        raise RefimplError(f"{url}: the connection failed ({exc.__class__.__name__}: {exc})") from None


def _json(raw: bytes, where: str):
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RefimplError(f"{where}: malformed response, not JSON ({getattr(exc, 'msg', exc)}): {raw[:60]!r}") from None


@dataclass
class Identity:
    """What a server says about the model it serves (None: not exposed)."""

    url: str
    model: str | None = None  # /v1/models data[0].id or /props model_path
    n_vocab: int | None = None
    n_embd: int | None = None
    n_ctx_train: int | None = None
    probe: list | None = None  # /tokenize of PROBE
    checked: list = field(default_factory=list)  # the properties compared with MODEL's

    def as_json(self) -> dict:
        return {"url": self.url, "model": self.model, "n_vocab": self.n_vocab, "n_embd": self.n_embd,
                "n_ctx_train": self.n_ctx_train, "probe_tokens": self.probe, "checked": self.checked}


def _int_or_none(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RefimplError(f"{where}: malformed response, expected an integer, got {value!r}")
    return value


def server_identity(url: str, timeout: float) -> Identity:
    """The server's model properties (module docstring, step 1); unknown endpoints are skipped. An
    unreachable server, a timeout and a malformed answer are one-line errors."""
    ident = Identity(url)
    raw = http(f"{url}/v1/models", None, timeout, missing_ok=True)
    if raw is not None:
        obj = _json(raw, f"{url}/v1/models")
        data = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(data, list) or (data and not isinstance(data[0], dict)):
            raise RefimplError(f"{url}/v1/models: malformed response, expected an object with a 'data' list")
        if len(data) > 1:
            raise RefimplError(f"{url}/v1/models: the server serves {len(data)} models; validate a server that serves one")
        if data:
            ident.model = data[0].get("id") if isinstance(data[0].get("id"), str) else None
            meta = data[0].get("meta")
            if isinstance(meta, dict):
                for key in ("n_vocab", "n_embd", "n_ctx_train"):
                    setattr(ident, key, _int_or_none(meta.get(key), f"{url}/v1/models meta.{key}"))
    raw = http(f"{url}/props", None, timeout, missing_ok=True)
    if raw is not None:
        props = _json(raw, f"{url}/props")
        if not isinstance(props, dict):
            raise RefimplError(f"{url}/props: malformed response, expected a JSON object")
        if isinstance(props.get("model_path"), str):
            ident.model = props["model_path"]
    raw = http(f"{url}/tokenize", {"content": PROBE, "add_special": False}, timeout, missing_ok=True)
    if raw is not None:
        obj = _json(raw, f"{url}/tokenize")
        toks = obj.get("tokens") if isinstance(obj, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise RefimplError(f"{url}/tokenize: malformed response, expected {{'tokens': [ids]}}")
        ident.probe = toks
    return ident


def model_mismatches(ident: Identity, config, tokenizer) -> list[str]:
    """What the server exposes that MODEL's file contradicts (empty: it may be the same file); records the
    properties compared in ``ident.checked``."""
    out = []
    for key, ours in (("n_vocab", config.n_vocab), ("n_embd", config.n_embd), ("n_ctx_train", config.n_ctx_train)):
        theirs = getattr(ident, key)
        if theirs is not None:
            ident.checked.append(key)
            if theirs != ours:
                out.append(f"{key} {theirs} (MODEL: {ours})")
    if ident.probe is not None:
        ident.checked.append("tokenization of a probe")
        ours = tokenizer.encode(PROBE, parse_special=False)
        if ident.probe != ours:
            out.append(f"the probe {PROBE!r} tokenizes to {ident.probe[:6]}… (MODEL: {ours[:6]}…)")
    return out


def completion(url: str, prompt: list[int], n_predict: int, draft: int | None, timeout: float) -> str:
    """One greedy ``/completion`` (module docstring, step 2) → the response text."""
    body = {"prompt": prompt, "n_predict": n_predict, "n_probs": N_PROBS, "temperature": 0, "return_tokens": True,
            "cache_prompt": False}
    if draft is not None:
        body["speculative.n_max"] = draft
    raw = http(f"{url}/completion", body, timeout)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RefimplError(f"{url}/completion: malformed response, not UTF-8") from None


def read_answer(text: str, where: str):
    """A /completion answer → (ids, ResponseInfo) by :func:`refimpl.oracle.responses.read_response`; anything
    else is a one-line "malformed response"."""
    from refimpl.oracle.responses import looks_like_response, read_response

    if not looks_like_response(text):
        raise RefimplError(f"{where}: malformed response, not a completion response: {text[:60]!r}")
    ids, _, info = read_response(text, where)
    return ids, info


def verdict(rep) -> str:
    """A row's verdict from an audit report: identical (every token the oracle's argmax), near-tie (only
    near-ties), wrong (a wrong token)."""
    if rep.n_wrong:
        return "wrong"
    return "near-tie" if rep.n_near_ties else "identical"


def finite_positive(value: float, flag: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise RefimplError(f"{flag} must be a number of seconds > 0, got {value}")
    return value
