"""The training code (train/, the optional ``train`` extra): skipped when torch is not installed.

Its forward pass must be refimpl's: torch's logits on the committed trained GGUF equal refimpl's to
~1e-6, and the chunked delta rule used for training equals the token-by-token one."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the train extra (pip install -e '.[train]') is not installed")

from refimpl.fixtures.builtin import TRAINED_PATH  # noqa: E402
from refimpl.decode.drafts import mtp_catchup_logits  # noqa: E402
from refimpl.model.trunk import forward, load_model  # noqa: E402
from refimpl.model.state import SeqState  # noqa: E402
from refimpl.tokenizer import Tokenizer  # noqa: E402
from train.check import torch_model  # noqa: E402
from train.export import file_tensors  # noqa: E402
from train.model import gated_delta_rule, gated_delta_rule_chunked  # noqa: E402


@pytest.mark.parametrize("T", [1, 31, 32, 77])
def test_chunked_delta_rule_equals_the_recurrence(T):
    g = torch.Generator().manual_seed(T)
    B, H, S = 2, 4, 16
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, S, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, S, generator=g, dtype=torch.float64)
    gate = -3 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    a, b = gated_delta_rule(q, k, v, gate, beta), gated_delta_rule_chunked(q, k, v, gate, beta, chunk=8)
    assert torch.max(torch.abs(a - b)).item() < 1e-12


def test_torch_forward_equals_refimpl_on_the_committed_file():
    torch.set_num_threads(1)
    model = torch_model(file_tensors(TRAINED_PATH))
    ref = load_model(TRAINED_PATH, pack=False)
    ids = Tokenizer.from_gguf(TRAINED_PATH).encode("And God called the light Day, and the darkness he called Night.")
    with torch.no_grad():
        logits_t, _, mtp_t, _ = model(torch.tensor([ids]))
    logits_r, h, _ = forward(ref, SeqState.fresh(ref.config), ids)
    assert np.abs(logits_t[0].numpy() - logits_r).max() < 1e-4
    assert np.abs(mtp_t[0].numpy() - mtp_catchup_logits(ref, ids, h)).max() < 1e-4


def test_consistency_loss_is_the_total_variation_of_consecutive_router_rows():
    from train.run import consistency_loss

    # two sequences of 3 tokens, 3 experts: rows of one sequence only are compared (never seq 0's last with seq 1's first)
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0],     # TV 1, 0
                          [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]],    # TV 0.5, 0.3
                         dtype=torch.float64, requires_grad=True)
    sel = torch.zeros(6, 2, dtype=torch.int64)
    tv = consistency_loss([(probs, sel), (probs.flip(-1), sel)], batch=2)
    assert abs(tv.item() - 2 * (1.0 + 0.0 + 0.5 + 0.3) / 4) < 1e-12  # Σ over the two layers of the mean
    tv.backward()
    assert probs.grad is not None and torch.any(probs.grad != 0)
