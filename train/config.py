"""The trained model's dimensions and training settings — everything ``python -m train.run`` fixes.

Dimensions follow the issue's scale: E = 256, 4 trunk layers with full attention every 4th layer
(GDN, GDN, GDN, attention, as real files with ``full_attention_interval`` 4), an MTP block, 16 experts
top-2 of width 64 plus a shared expert of width 128, a 2,048-token byte-level BPE vocabulary.
The attention and Gated DeltaNet widths are the ``tiny`` fixture's (H 4 / Hkv 2 × 64, R 16 with IMRoPE
sections 3/3/2/0, Hk 2 / Hv 4 × 64, conv kernel 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from refimpl.fixtures.presets import FixturePreset

SEQ_LEN = 256  # training window; the file's context_length

MODEL = FixturePreset(
    name="kjv",
    description="trained on the King James Bible: E=256, V=2048, 4 trunk layers (GDN, GDN, GDN, attention) "
                "+ MTP block, 16 experts top-2 (F=64) + shared expert (Fs=128)",
    n_vocab=2048,
    context_length=SEQ_LEN,
    n_expert=16,
    n_expert_used=2,
    n_ff_exp=64,
    n_ff_shexp=128,
)
MODEL.check()


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    steps: int = 2000
    batch: int = 8  # sequences of SEQ_LEN tokens per step (2,048 tokens)
    lr: float = 2e-3  # AdamW peak, linear warm-up then cosine to lr_final
    lr_final: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1  # matrices only (not norms, conv kernels, biases, A_log)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    mtp_weight: float = 0.5  # loss = CE(trunk) + mtp_weight · CE(MTP) + aux_weight · Σ_layers balance
    aux_weight: float = 0.01  # Switch-style load balance: X · Σ_e (share of picks of e) · (mean router p of e)
    # + consistency_weight · Σ_layers (mean over consecutive positions of the total-variation distance
    # between their router distributions): routing that follows the text (docs/trained-model.md); 0 = the
    # recipe of the first committed model
    consistency_weight: float = 0.01
    threads: int = 1

    def as_json(self) -> dict:
        return asdict(self)
