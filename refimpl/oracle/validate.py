"""``refimpl validate``: drive running inference servers with a prompt suite and audit what they answer
(docs/validating-an-engine.md, §3e and §3f).

For each server (one per draft setting: llama-server configures speculative decoding when it starts):

0. Which API (``--api``; :func:`server_identity`): llama-server's native one when ``GET /props`` answers with
   its shape (``auto``, the default) or when told (``llama``); else OpenAI's ``/v1/completions``
   (refimpl.oracle.validate_openai: vLLM, SGLang, llama-server's own ``/v1``).
1. Identity (:func:`server_identity`, :func:`model_mismatches`): ``GET /v1/models`` (llama-server's
   ``meta``: ``n_vocab``, ``n_embd``, ``n_ctx_train``; vLLM's ``max_model_len`` is shown, not compared),
   ``GET /props`` (``model_path``) and ``POST /tokenize`` of a probe text. A server whose vocabulary size,
   embedding width, training context or tokenization of the probe differs from MODEL's cannot serve the
   same file: refused in one line before any prompt is sent. A server that exposes none of these is not
   checked, and the table says so; its answers are judged all the same.
2. Per prompt: ``POST /completion`` with the prompt as token ids (no tokenizer of the server is involved),
   greedy (``temperature`` 0), ``n_probs`` (the top-k log-probs, refimpl.oracle.probs) and ``return_tokens``;
   with ``drafts``, also llama-server's per-request ``speculative.n_max`` (server-schema.cpp). An OpenAI
   server: ``POST /v1/completions`` (refimpl.oracle.validate_openai.request_body).
3. The response is read by :func:`refimpl.oracle.responses.read_response` and audited against the oracle
   (:func:`refimpl.oracle.audit.audit`: the ids, and the log-probs' ``probs:`` verdict). With ``--threshold auto``
   the near-tie threshold is each server's own, calibrated on the log-probs of all its answers
   (refimpl.oracle.calibrate; refimpl.cli.validate pools them after the last prompt and judges again).

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


def http(url: str, body: dict | None, timeout: float, *, missing_ok: bool = False,
         any_status_ok: bool = False) -> bytes | None:
    """GET (``body`` None) or POST JSON to ``url`` → the answer's bytes; ``missing_ok``: None for a 404 / 405 /
    501 (an endpoint this server does not have); ``any_status_ok``: None for any HTTP error status (a probe
    whose refusal only means "not exposed"). Any other failure is one line (:class:`RefimplError`)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as exc:
        if (missing_ok and exc.code in (404, 405, 501)) or any_status_ok:
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
    api: str = "llama"  # "llama": /completion; "openai": /v1/completions
    model: str | None = None  # /v1/models data[0].id or /props model_path
    served: str | None = None  # the request's "model": --served-model, else (openai) the /v1/models id
    n_vocab: int | None = None
    n_embd: int | None = None
    n_ctx_train: int | None = None
    max_model_len: int | None = None  # vLLM's /v1/models: shown, not compared (refimpl.oracle.validate_openai)
    probe: list | None = None  # /tokenize of PROBE
    checked: list = field(default_factory=list)  # the properties compared with MODEL's

    def as_json(self) -> dict:
        return {"url": self.url, "api": self.api, "model": self.model, "served_model": self.served,
                "n_vocab": self.n_vocab, "n_embd": self.n_embd, "n_ctx_train": self.n_ctx_train,
                "max_model_len": self.max_model_len, "probe_tokens": self.probe, "checked": self.checked,
                "identity_checked": bool(self.checked)}


def _int_or_none(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RefimplError(f"{where}: malformed response, expected an integer, got {value!r}")
    return value


def _models_entry(url: str, obj, served_model: str | None) -> dict | None:
    """The ``/v1/models`` entry of the model to validate: the only one, or ``served_model``'s."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise RefimplError(f"{url}/v1/models: malformed response, expected an object with a 'data' list of objects")
    ids = [d.get("id") for d in data]
    if served_model is not None:
        if served_model not in ids:
            listed = ", ".join(str(i) for i in ids[:5]) or "none"
            raise RefimplError(f"--served-model {served_model}: {url}/v1/models does not list it (it lists: {listed})")
        return data[ids.index(served_model)]
    if len(data) > 1:
        raise RefimplError(f"{url}/v1/models: the server serves {len(data)} models; name the one to validate with "
                           "--served-model NAME")
    return data[0] if data else None


def server_identity(url: str, timeout: float, api: str = "llama", served_model: str | None = None) -> Identity:
    """The server's API and model properties (module docstring, steps 0 and 1); unknown endpoints are
    skipped. ``api``: ``llama``, ``openai`` or ``auto``. An unreachable server, a timeout and a malformed
    answer are one-line errors."""
    from refimpl.oracle import validate_openai as oa

    props_raw = http(f"{url}/props", None, timeout, missing_ok=True) if api != "openai" else None
    if api == "auto":
        api = "llama" if oa.looks_like_llama_props(props_raw) else "openai"
    ident = Identity(url, api)
    raw = http(f"{url}/v1/models", None, timeout, missing_ok=True)
    if raw is not None:
        entry = _models_entry(url, _json(raw, f"{url}/v1/models"), served_model)
        if entry is not None:
            ident.model = entry.get("id") if isinstance(entry.get("id"), str) else None
            meta = entry.get("meta")
            if isinstance(meta, dict):
                for key in ("n_vocab", "n_embd", "n_ctx_train"):
                    setattr(ident, key, _int_or_none(meta.get(key), f"{url}/v1/models meta.{key}"))
            ident.max_model_len = _int_or_none(entry.get("max_model_len"), f"{url}/v1/models max_model_len")
    ident.served = served_model if served_model is not None else ident.model if api == "openai" else None
    if api == "openai":
        ident.probe = oa.tokenize_probe(http, url, ident.served, PROBE, timeout)
        return ident
    if props_raw is not None:
        props = _json(props_raw, f"{url}/props")
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


def completion(ident: Identity, prompt: list[int], n_predict: int, draft: int | None, timeout: float) -> tuple[str, str]:
    """One greedy completion (module docstring, step 2) → (the response text, the endpoint's URL)."""
    url = ident.url
    if ident.api == "openai":
        from refimpl.oracle import validate_openai as oa

        return oa.completion(http, url, ident.served, prompt, n_predict, N_PROBS, timeout), f"{url}/v1/completions"
    body = {"prompt": prompt, "n_predict": n_predict, "n_probs": N_PROBS, "temperature": 0, "return_tokens": True,
            "cache_prompt": False}
    if draft is not None:
        body["speculative.n_max"] = draft
    if ident.served is not None:  # --served-model (llama-server's router mode picks the model by it)
        body["model"] = ident.served
    raw = http(f"{url}/completion", body, timeout)
    try:
        return raw.decode("utf-8"), f"{url}/completion"
    except UnicodeDecodeError:
        raise RefimplError(f"{url}/completion: malformed response, not UTF-8") from None


def read_answer(text: str, where: str, api: str = "llama", tokenizer=None):
    """A completion answer → (ids, ResponseInfo) by :func:`refimpl.oracle.responses.read_response` (``tokenizer``:
    MODEL's, which places the log-probs around the tokens llama-server held back and recovers the ids its
    ``/v1`` answers leave out); anything else is a one-line "malformed response"; an OpenAI answer without
    token ids is refused in one line (refimpl.oracle.validate_openai.check_ids)."""
    from refimpl.oracle.responses import looks_like_response, read_response

    if not looks_like_response(text):
        raise RefimplError(f"{where}: malformed response, not a completion response: {text[:60]!r}")
    if api == "openai":
        from refimpl.oracle.validate_openai import check_ids

        check_ids(text, where)
    ids, _, info = read_response(text, where, tokenizer)
    return ids, info


def expected_drafts(model, prompt: list[int], n_predict: int, ctx, spec_type: str, n_max: int, p_min: float,
                    eog_ids, cache: dict) -> tuple[int, int] | str:
    """The oracle's own draft-MTP run of ``prompt`` with the server's settings → (accepted, drafted), the
    acceptance a correct engine should report (llama-server's ``timings.draft_n_accepted`` / ``draft_n``); or
    why there is none: the server drafts with another source, or MODEL has no MTP head. ``spec_type``,
    ``n_max``, ``p_min``: how the server was started (``--spec-type``, ``--spec-draft-n-max``,
    ``--spec-draft-p-min``), which llama-server does not expose (its ``/props`` reports ``speculative.types``
    "none" whatever it runs, and ``draft-mtp`` ignores the per-request ``speculative.n_max``).
    ``cache``: results by (prompt, n_max, p_min), shared by the columns of one run."""
    if spec_type != "draft-mtp":
        return f"not compared: {spec_type} drafts"
    if not model.config.has_mtp:
        return "not compared: MODEL has no MTP head"
    key = (tuple(prompt), n_max, p_min)
    if key not in cache:
        from refimpl.decode.speculative import speculative_generate

        _, stats = speculative_generate(model, prompt, n_predict, ctx, source="mtp", n_draft=n_max, p_min=p_min,
                                        eog_ids=eog_ids)
        cache[key] = (stats.n_accepted, stats.n_drafted)
    return cache[key]


def verdict(rep) -> str:
    """A row's verdict from an audit report: identical (every token the oracle's argmax), near-tie (only
    near-ties), wrong (a wrong token). With a prediction (``--emulate=ggml``: refimpl.oracle.reproduce)
    instead: reproduced (the answer is llama.cpp's predicted stream for the server's draft setting, with
    near-ties or wrong tokens that llama.cpp's own batches compute), identical (that, and every token the
    oracle's argmax) or not reproduced (the answer is not llama.cpp's predicted stream)."""
    if rep.reproduce is not None:
        return "not reproduced" if rep.reproduce.exit_code else "reproduced" if rep.events else "identical"
    if rep.n_wrong:
        return "wrong"
    return "near-tie" if rep.n_near_ties else "identical"


def finite_positive(value: float, flag: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise RefimplError(f"{flag} must be a number of seconds > 0, got {value}")
    return value


def schedule_of(info, d, spec_type: str, spec_n_max: int):
    """The llama.cpp batch schedule (refimpl.oracle.reproduce.Schedule) a server answered with: its per-request
    n_max ``d`` (0: plain), else --spec-draft-n-max when it drafted, else plain decode — with llama-server's
    prompt batches; None when it drafted with another --spec-type than draft-mtp (no prediction)."""
    from refimpl.oracle.reproduce import Schedule

    if d is not None:
        n = min(d, 8)
    else:
        n = spec_n_max if info.draft_n is not None else 0
    if n and spec_type != "draft-mtp":
        return None
    return Schedule(n, server=True)
