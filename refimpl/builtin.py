"""Model arguments: a GGUF path, the built-in trained model, or a built-in synthetic fixture.

* **The built-in trained model** (``builtin:kjv``) is what ``run``, ``logits`` and ``trace`` use when
  no MODEL is given: a small qwen35moe with an MTP head trained on the King James Bible, shipped in the
  package as ``refimpl/models/kjv-q8_0.gguf`` (its sha256 is :data:`TRAINED_SHA256`; train/ and
  docs/trained-model.md say how it was made).
* **Synthetic fixtures** (``builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE…]``, e.g. ``builtin:tiny/f32``)
  are generated on first use into a cache directory (``$REFIMPL_CACHE``, default ``~/.cache/refimpl``)
  and reused afterwards; generation is deterministic, so every machine gets the same bytes. ``builtin:``
  alone is ``builtin:tiny/f32``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from refimpl.errors import RefimplError
from refimpl.output_path import writing

BUILTIN_PRESET = "tiny"
BUILTIN_QUANT = "f32"
BUILTIN_SEED = 0
BUILTIN_PREFIX = "builtin:"

TRAINED_SPEC = "builtin:kjv"  # the built-in trained model (the default MODEL)
TRAINED_SPELLINGS = (TRAINED_SPEC, TRAINED_SPEC + "/q8_0")
TRAINED_PATH = Path(__file__).parent / "models" / "kjv-q8_0.gguf"
TRAINED_SHA256 = "539ed9cf7e5fac356f25e1742be508655712766a2620797576f81af5f8716469"
TRAINED_DESCRIPTION = (
    "a 7M-parameter qwen35moe trained on the King James Bible (E=256, 4 trunk layers + MTP head, "
    "16 experts top-2, 2048-token BPE), q8_0"
)


def trained_path() -> Path:
    """The packaged trained model's file (a one-line RefimplError when the package lacks it)."""
    if not TRAINED_PATH.is_file():
        raise RefimplError(f"the built-in trained model {TRAINED_PATH} is missing from this installation; pass a MODEL")
    return TRAINED_PATH


def is_trained_spec(arg: str) -> bool:
    return arg in TRAINED_SPELLINGS


def cache_dir() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE") or Path.home() / ".cache" / "refimpl")


def fixture_path(preset: str = BUILTIN_PRESET, quant: str = BUILTIN_QUANT, seed: int = BUILTIN_SEED, **options) -> Path:
    """Path of a cached fixture, generating it if needed."""
    from refimpl.fixtures import write_fixture

    suffix = "".join(f"-{k}={v}" for k, v in sorted(options.items()))
    path = cache_dir() / f"{preset}-{quant}-s{seed}{suffix}.gguf"
    if not path.is_file():
        with writing(path, "the fixture cache ($REFIMPL_CACHE)"):
            write_fixture(path, preset=preset, quant=quant, seed=seed, **options)
    return path


# ---- model arguments: a GGUF path or a built-in fixture ---------------------------------------


@dataclass(frozen=True)
class FixtureRecipe:
    """How ``refimpl.fixtures.write_fixture`` makes a file; ``options`` holds non-default values only."""

    preset: str
    quant: str
    seed: int = 0
    options: dict = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The canonical ``builtin:`` spelling, e.g. ``builtin:predictable/q8_0/seed=1/mtp_mismatch=0.5``."""
        parts = [self.preset, self.quant] + ([f"seed={self.seed}"] if self.seed else [])
        parts += [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(self.options.items())]
        return BUILTIN_PREFIX + "/".join(parts)

    def as_json(self) -> dict:
        return {"spec": self.spec, "preset": self.preset, "quant": self.quant, "seed": self.seed, "options": dict(self.options)}


def parse_builtin(spec: str) -> FixtureRecipe:
    """``builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE …]`` → recipe. QUANT defaults to f32, the seed
    to 0; KEY=VALUE are fixture options (values read as JSON when they parse: true, 0.5; else text).
    ``builtin:`` alone is tiny, f32, seed 0 (``builtin:kjv``, the trained model, is not a fixture recipe)."""
    body = spec[len(BUILTIN_PREFIX):]
    parts = [p for p in body.split("/")] if body else []
    if any(not p for p in parts):
        raise RefimplError(f"bad built-in model '{spec}': empty segment (expected builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE…])")
    plain = [p for p in parts if "=" not in p]
    if len(plain) > 2 or parts[: len(plain)] != plain:
        raise RefimplError(f"bad built-in model '{spec}': expected builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE…]")
    preset = plain[0] if plain else BUILTIN_PRESET
    quant = plain[1] if len(plain) > 1 else BUILTIN_QUANT
    seed, options = BUILTIN_SEED, {}
    for item in parts[len(plain):]:
        key, _, value = item.partition("=")
        if key == "seed":
            try:
                seed = int(value)
            except ValueError:
                raise RefimplError(f"bad built-in model '{spec}': seed must be an integer, got '{value}'") from None
            continue
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return canonical_recipe(FixtureRecipe(preset, quant, seed, options))


def canonical_recipe(recipe: FixtureRecipe) -> FixtureRecipe:
    """Drop options equal to the preset's defaults (so one recipe has one spelling); validate."""
    from refimpl.config import ARCH
    from refimpl.fixtures import PRESETS, QUANT_MIXES, resolve_options

    if recipe.preset not in PRESETS:
        raise RefimplError(f"unknown fixture preset '{recipe.preset}' (valid: {', '.join(PRESETS)}; "
                           f"{TRAINED_SPEC} is the trained model)")
    if recipe.quant not in QUANT_MIXES:
        raise RefimplError(f"unknown quant mix '{recipe.quant}' (valid: {', '.join(QUANT_MIXES)})")
    preset = PRESETS[recipe.preset]
    effective = resolve_options(preset, recipe.options)
    defaults = {**resolve_options(preset, {"arch": effective["arch"]}), "arch": ARCH}  # the arch's own defaults (qwen3next: ssm_in)
    options = {k: v for k, v in effective.items() if defaults.get(k) != v}
    return FixtureRecipe(recipe.preset, recipe.quant, int(recipe.seed), options)


def recipe_of(gguf_file) -> FixtureRecipe | None:
    """The recipe a ``refimpl.fixtures`` file records in its metadata, or None for other files and
    for the large presets (``refimpl.fixtures.large``: written from a pooled draw, not by
    ``write_fixture``, so not a ``builtin:`` spec; a golden made from one is checked with MODEL given)."""
    from refimpl.fixtures.presets import LARGE_PRESETS

    preset = gguf_file.key("refimpl.fixture.preset")
    if preset is None or preset in LARGE_PRESETS:
        return None
    options = json.loads(gguf_file.key("refimpl.fixture.options", "{}"))
    return canonical_recipe(FixtureRecipe(preset, gguf_file.key("refimpl.fixture.quant"), int(gguf_file.key("refimpl.fixture.seed", 0)), options))


def build_fixture(recipe: FixtureRecipe) -> Path:
    """The cached file of a recipe (``refimpl.builtin.fixture_path``), built on first use."""
    return fixture_path(recipe.preset, recipe.quant, recipe.seed, **recipe.options)


def resolve_model(arg: str) -> Path:
    """A MODEL argument → the GGUF path (``builtin:kjv`` is the packaged trained model; another
    ``builtin:`` spec is built into the cache)."""
    if is_trained_spec(arg):
        return trained_path()
    if arg.startswith(BUILTIN_PREFIX):
        return build_fixture(parse_builtin(arg))
    return Path(arg)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
