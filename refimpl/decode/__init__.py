"""Decoding on top of the model: plain greedy decoding, draft sources, the self-speculative loop and its
telemetry.

Reading order: ``greedy`` (one token at a time) → ``drafts`` (the MTP head and n-gram prompt lookup as
draft sources) → ``speculative`` (draft, verify 1+N in one batch, accept, roll back by snapshot, catch
up) → ``telemetry`` (the per-round CSV and summary).

May import: ``refimpl.errors``, ``refimpl.io``, ``refimpl.model``, ``refimpl.tokenizer``.
"""
