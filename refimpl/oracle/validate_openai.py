"""``refimpl validate`` against an OpenAI-compatible server (vLLM, SGLang, llama-server's own ``/v1``): the
request, the check that the answer names token ids, and how ``--api auto`` tells llama-server apart
(docs/validating-an-engine.md, §3f).

* **Which API** (:func:`looks_like_llama_props`): a server whose ``GET /props`` answers a JSON object with
  llama-server's keys (``default_generation_settings``, ``total_slots``, ``model_path``, ``build_info``:
  ``server-context.cpp`` of llama.cpp as vendored in llama-cpp-python 0.3.36) is driven through its native
  ``/completion``; any other server through ``/v1/completions``.
* **The request** (:func:`request_body`): ``POST /v1/completions`` with ``model`` (``/v1/models``
  ``data[0].id`` or ``--served-model``), ``prompt`` as a list of token ids (one prompt, as the OpenAI API
  allows), ``max_tokens``, ``temperature`` 0, ``logprobs`` 5 (the legacy completions API's top-k), and
  fields other servers ignore: vLLM's ``return_tokens_as_token_ids`` (a token is ``"token_id:N"``) and
  ``return_token_ids`` (``choices[0].token_ids``), llama-server's ``cache_prompt`` false. vLLM accepts
  unknown fields (its protocol models allow extras and log them); llama-server copies them into its
  parameters and reads only the ones it knows (``oaicompat_completion_params_parse``, server-common.cpp;
  measured: the same answer with and without them). No per-request draft length exists in this API.
* **Ids or nothing** (:func:`check_ids`): an answer whose tokens are text without ids cannot be audited
  and is refused in one line, naming vLLM's ``--return-tokens-as-token-ids``. llama-server's ``/v1`` answers
  name no id for a token whose bytes end inside a UTF-8 character (it holds such tokens back): the reader
  recovers them with MODEL's tokenizer from the bytes sent after them, or refuses in one line where they split
  more than one way (refimpl.oracle.response_align); ``--api llama``'s whole ``/completion`` names every id.
* **Identity** (:func:`tokenize_probe`): ``POST /tokenize`` with llama-server's fields (``content``,
  ``add_special``) and vLLM's (``prompt``, ``add_special_tokens``, ``model``) together; an answer that is
  not ``{"tokens": [ids]}`` (or an HTTP error) means the server does not expose its tokenizer here and
  nothing is compared. vLLM's ``/v1/models`` ``max_model_len`` is shown, not compared: a server may set any
  length, and rope scaling may extend it beyond the file's training context.
"""

from __future__ import annotations

import json

from refimpl.errors import RefimplError

#: Keys of llama-server's ``GET /props`` answer; one of them is enough to call a server llama-server.
LLAMA_PROPS_KEYS = ("default_generation_settings", "total_slots", "model_path", "build_info")
#: The vLLM server option that makes its log-prob tokens ids ("token_id:N") for every request.
VLLM_IDS_OPTION = "--return-tokens-as-token-ids"


def _json_or_none(raw: bytes | None):
    """An optional answer's JSON, or None when there is none or it is not JSON (a probe, not a refusal)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def looks_like_llama_props(raw: bytes | None) -> bool:
    """Whether a ``/props`` answer (None: the endpoint is missing) has llama-server's shape."""
    obj = _json_or_none(raw)
    return isinstance(obj, dict) and any(k in obj for k in LLAMA_PROPS_KEYS)


def request_body(model: str | None, prompt: list[int], n_predict: int, n_probs: int) -> dict:
    """The ``/v1/completions`` body (module docstring); ``model`` None: left out (the server's default)."""
    body = {"prompt": list(prompt), "max_tokens": n_predict, "temperature": 0, "logprobs": n_probs, "n": 1,
            "stream": False, "return_tokens_as_token_ids": True, "return_token_ids": True, "cache_prompt": False}
    if model is not None:
        body = {"model": model, **body}
    return body


def completion(http, url: str, model: str | None, prompt: list[int], n_predict: int, n_probs: int, timeout: float) -> str:
    """One greedy ``/v1/completions`` → the answer's text (``http``: refimpl.oracle.validate.http)."""
    raw = http(f"{url}/v1/completions", request_body(model, prompt, n_predict, n_probs), timeout)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RefimplError(f"{url}/v1/completions: malformed response, not UTF-8") from None


def _is_id(token) -> bool:
    return (isinstance(token, int) and not isinstance(token, bool)) or (isinstance(token, str) and token.startswith("token_id:"))


def check_ids(text: str, where: str) -> None:
    """Refuse, in one line, an OpenAI-style answer that gives its tokens as text only (no ``token_ids``, no
    ``id`` / ``"token_id:N"`` in the log-probs) or no tokens at all besides text. Anything else — including a
    malformed answer — is left to :func:`refimpl.oracle.responses.read_response`."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
        return
    c = choices[0]
    if isinstance(c.get("token_ids"), list):
        return
    lp = c.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        tokens = [e.get("id", e.get("token")) if isinstance(e, dict) else None for e in lp["content"]]
    elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
        tokens = lp["tokens"]
    elif lp is None:
        if c.get("text"):
            raise RefimplError(f"{where}: the answer has text but neither log-probs nor token ids (the server ignored "
                               f"logprobs and return_token_ids); validate needs ids: start vLLM with {VLLM_IDS_OPTION}")
        return
    else:
        return
    if tokens and not all(_is_id(t) for t in tokens):
        raise RefimplError(f"{where}: the server gave its tokens as text, without ids (it ignored return_tokens_as_token_ids "
                           f"and return_token_ids); validate needs ids: start vLLM with {VLLM_IDS_OPTION}")


def tokenize_probe(http, url: str, model: str | None, text: str, timeout: float) -> list[int] | None:
    """The server's tokenization of ``text`` without special tokens, or None when it does not expose one
    (module docstring)."""
    body = {"content": text, "add_special": False, "prompt": text, "add_special_tokens": False}
    if model is not None:
        body["model"] = model
    obj = _json_or_none(http(f"{url}/tokenize", body, timeout, missing_ok=True, any_status_ok=True))
    toks = obj.get("tokens") if isinstance(obj, dict) else None
    if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
        return None
    return toks
