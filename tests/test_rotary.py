"""Rotary positions (model.position=rope, arXiv 2104.09864): the rotation against complex arithmetic written here,
scores that depend on the offset only, no position table, and the configuration errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from study.config import ConfigError, load_config
from study.modeling.accounting import describe
from study.modeling.model import GPT, rotary
from tests.test_model import VOCAB, model_cfg, variant_cfg


def test_rotary_is_a_complex_rotation_of_each_half_split_pair():
    """Pair (x_i, x_{i+d/2}) as the complex number x_i + j x_{i+d/2}; position t multiplies it by
    exp(j t 10000^(-2i/d)) (the RoFormer frequencies, the GPT-NeoX half split)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64)  # (B, n_head, T, head_dim)
    d = 8
    z = x[..., : d // 2].numpy() + 1j * x[..., d // 2:].numpy()  # (B, n_head, T, d/2)
    theta = np.array([10000.0 ** (-2 * i / d) for i in range(d // 2)])
    rot = z * np.exp(1j * np.arange(7)[:, None] * theta[None, :])  # (T, d/2) broadcast
    want = np.concatenate([rot.real, rot.imag], axis=-1)
    np.testing.assert_allclose(rotary(x).numpy(), want, atol=1e-6)  # angles in fp32, as the model computes them
    assert torch.equal(rotary(x)[..., 0, :], x[..., 0, :])  # position 0 is not turned


def test_rotary_scores_depend_on_the_offset_only():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    seq = torch.zeros(1, 1, 12, 16, dtype=torch.float64)

    def score(t: int, s: int) -> float:
        a, b = seq.clone(), seq.clone()
        a[0, 0, t], b[0, 0, s] = q, k
        return float(rotary(a)[0, 0, t] @ rotary(b)[0, 0, s])

    assert score(5, 2) == pytest.approx(score(9, 6), rel=1e-6) == pytest.approx(score(3, 0), rel=1e-6)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)  # another offset, another score
    assert score(4, 4) == pytest.approx(float(q @ k), rel=1e-6)  # offset 0: the plain dot product


def test_a_rope_model_has_no_position_table_and_the_same_non_embedding_parameters():
    base, rope = model_cfg("nano"), model_cfg("nano", position="rope")
    v = variant_cfg("baseline")
    a, b = describe(base, v, VOCAB), describe(rope, v, VOCAB)
    assert a["non_embedding_params"] == b["non_embedding_params"]
    assert a["total_params"] - b["total_params"] == base.block_size * base.n_embd  # the wpe table
    model = GPT(rope, v, VOCAB, init_seed=0)
    assert "wpe" not in model.transformer
    idx = torch.randint(0, VOCAB, (2, rope.block_size))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, rope.block_size, VOCAB) and torch.isfinite(loss)
    # bidirectional with rope: moving the whole window by one token changes the output at the moved tokens only
    # through what they see, so a window of one repeated token gives the same output at every position
    enc = GPT(rope, v, VOCAB, init_seed=0, causal=False)
    out = enc(torch.full((1, 16), 7))[0][0]  # (T, vocab_size)
    torch.testing.assert_close(out, out[:1].expand_as(out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("over,words", [(["model.position=alibi"], ["model.position='alibi'", "'learned' or 'rope'"]),
                                        (["task.position=alibi"], ["task.position='alibi'", "'learned' or 'rope'"]),
                                        (["model.position=rope", "model.n_embd=36", "model.n_head=4"],
                                         ["head_dim = 9", "odd"])])
def test_bad_positions_are_refused_in_one_line(nano_project, over, words):
    with pytest.raises(ConfigError) as e:
        load_config(["model=nano", *over], nano_project)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words)


def test_the_task_picks_the_positions_a_run_does_not_name(nano_project, tmp_path):
    """model.position null takes task.position: mlm rope, lm and mqar learned; a run that names its own keeps it;
    params.yaml keeps DVC's unresolved composition, and a stage reading it with task=mlm resolves rope."""
    import yaml

    from study.config.compose import composed_params

    picked = {t: load_config(["model=nano", f"task={t}"], nano_project).model.position for t in ("lm", "mlm", "mqar")}
    assert picked == {"lm": "learned", "mlm": "rope", "mqar": "learned"}
    assert load_config(["model=nano", "task=mlm", "model.position=learned"], nano_project).model.position == "learned"
    assert load_config(["model=nano", "model.position=rope"], nano_project).model.position == "rope"
    assert yaml.safe_load(composed_params(nano_project, ["task=mlm"]))["model"]["position"] is None
    (tmp_path / "params.yaml").write_text(composed_params(nano_project))
    assert load_config(["task=mlm"], nano_project, params=tmp_path / "params.yaml").model.position == "rope"
    assert load_config([], nano_project, params=tmp_path / "params.yaml").model.position == "learned"
    # the schema's null builds nanoGPT's position table (a config that never met a task is an lm's)
    assert "wpe" in GPT(model_cfg("nano", position=None), variant_cfg("baseline"), VOCAB, init_seed=0).transformer
    with pytest.raises(ConfigError) as e:  # an odd head_dim under mlm's rotary default names both fixes
        load_config(["model=nano", "task=mlm", "model.n_embd=36", "model.n_head=4"], nano_project)
    assert "\n" not in str(e.value) and "model.position=learned" in str(e.value)
