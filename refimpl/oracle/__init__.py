"""The oracle's verdicts: golden files and runs, audits of an engine's streams and rounds, the
intermediate-tensor recorder, pictures, and the Dask cluster that runs goldens and audits in parallel.

Reading order: ``trace`` (recording and patching named intermediates) → ``dumper`` (an engine's intermediates
from llama.cpp's eval callback) → ``dump_read`` (the DUMP formats) → ``trace_against`` (where an engine departs)
→ ``trace_report`` → ``golden_run`` (one prompt's stream, the unit of work) → ``cluster`` → ``golden_file`` (the JSON-lines format) → ``golden`` (make and
check) → ``golden_audit`` → ``rounds`` (replaying an engine's speculative rounds) → ``reproduce`` (does llama.cpp's own
batch schedule compute the stream?) → ``responses`` (a server's
response as a stream) → ``response_align`` (its log-prob entries placed on its ids, the ids it leaves out
recovered) → ``probs`` (its log-probs against the oracle's) → ``stream_file`` (every stream format
read as one) → ``calibrate`` (--threshold auto's spread and threshold) → ``audit`` (judging a stream token by token) → ``audit_report`` (its text) → ``audit_streams`` → ``kld_file`` (llama-perplexity's KL-divergence base file)
→ ``kld`` (the oracle as its base or as its model) → ``kld_report`` (its statistics) → ``validate`` (a live
llama-server) → ``validate_openai`` (an OpenAI-compatible server) → ``plot`` → ``html_page`` → ``html_report`` (the
report as one web page).

May import: ``refimpl.errors``, ``refimpl.io``, ``refimpl.model``, ``refimpl.decode``,
``refimpl.tokenizer``, ``refimpl.fixtures``.
"""
