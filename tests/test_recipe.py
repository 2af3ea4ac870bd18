"""The recipe arms of issue 23: QK-norm, k-norm, per-head normalised nonlinear query, the GELU-free
ablation, split depth, the d2z/wsd schedules, z-loss and the attention-logit probe.

Expected values are computed here independently of study/modeling/model.py and study/modeling/lit_module.py (explicit tensor
algebra, formulas), except the pin test, whose values were recorded on the code before this change.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from study.config import RunConfig

CONF = Path(__file__).resolve().parent.parent / "conf"
VOCAB = 512  # embedding rows of the nano runs here (tokens)


def nano_run_config(variant: str, **train) -> RunConfig:
    """The nano model (conf/model/nano.yaml) with conf/variant/VARIANT.yaml on a VOCAB-token BPE, schema defaults
    elsewhere."""
    cfg = OmegaConf.structured(RunConfig)
    cfg.data.tokenizer, cfg.data.vocab_size = "bpe", VOCAB
    cfg.model = OmegaConf.merge(cfg.model, OmegaConf.load(CONF / "model" / "nano.yaml"))
    cfg.variant = OmegaConf.merge(cfg.variant, OmegaConf.load(CONF / "variant" / f"{variant}.yaml"))
    for k, v in train.items():
        cfg.train[k] = v
    return cfg


def short_run(variant: str, steps: int = 10) -> float:
    """A fixed 10-step AdamW run of the nano model on random tokens (fp32, 1 thread), through GPTModule's
    own loss, optimizer groups and lr schedule (warmup 2 steps, cosine 1e-2 -> 1e-3), clip 1.0; returns
    the loss on the first batch after the last step (nats)."""
    from study.modeling.lit_module import GPTModule

    torch.set_num_threads(1)
    cfg = nano_run_config(variant, batch_tokens=256, tokens=256 * steps, warmup_tokens=512, lr=1e-2, min_lr=1e-3)
    cfg.seed = 7
    module = GPTModule(cfg)
    opts = module.configure_optimizers()
    opt, sched = opts["optimizer"], opts["lr_scheduler"]["scheduler"]
    tokens = torch.randint(0, VOCAB, (steps, 4, cfg.model.block_size + 1),
                           generator=torch.Generator().manual_seed(123))
    for step in range(steps):
        module._loss(tokens[step])[0].backward()
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), cfg.train.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        return module._loss(tokens[0])[0].item()


# Recorded on commit 969601b (before the recipe switches existed) by short_run itself,
# CPU "Intel(R) Xeon(R) Processor" (lscpu Model name), torch fp32, 1 thread; reproduced twice bit for bit.
PINNED = {"baseline": 6.118424892425537, "nonlinear_q": 6.117162227630615, "identity_q": 6.115249156951904}


@pytest.mark.parametrize("variant", sorted(PINNED))
def test_switches_off_leave_the_loss_unchanged(variant):
    """With every recipe switch off, a short run's loss equals its value before the switches existed.

    Tolerance 1e-5 relative: another x86 CPU (other SIMD widths, other BLAS blocking) rounds fp32 sums
    differently, which over 10 steps moves the loss by ~1e-6 relative; the three arms differ from each
    other by 2e-4 to 5e-4 relative here, so any change of an op (a scale, a norm, an extra term) fails."""
    assert short_run(variant) == pytest.approx(PINNED[variant], rel=1e-5)


# -- parameters -----------------------------------------------------------------------------------
def model_and_variant(model: str, variant: str, **over):
    from study.config import ModelConfig, VariantConfig

    m = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    v = OmegaConf.merge(OmegaConf.structured(VariantConfig), OmegaConf.load(CONF / "variant" / f"{variant}.yaml"))
    for k, x in over.items():
        v[k] = x
    return m, v


def non_embedding(model: str, variant: str, **over) -> int:
    from study.modeling.accounting import describe

    return describe(*model_and_variant(model, variant, **over), VOCAB)["non_embedding_params"]


@pytest.mark.parametrize("model", ["nano", "gpt3-small"])
def test_the_arms_parameter_counts(model):
    """Each parameter-matching claim of the arms, against counts written out from the shapes."""
    m = OmegaConf.load(CONF / "model" / f"{model}.yaml")
    L, C, hd = m.n_layer, m.n_embd, m.n_embd // m.n_head
    base = non_embedding(model, "baseline")
    nonlinear = base + L * 2 * C  # W1 (C/2 x C) + W2 (C x C/2) replace W_Q (C x C); + RMSNorm and LN gains
    assert non_embedding(model, "nonlinear_q") == nonlinear
    assert non_embedding(model, "baseline_qknorm") == base  # parameter-free QK-norm
    assert non_embedding(model, "nonlinear_q_qknorm") == nonlinear
    assert non_embedding(model, "nonlinear_q_linear") == nonlinear  # the GELU has no parameters
    assert non_embedding(model, "nonlinear_q_ph") == nonlinear  # g is the LN gain, reshaped
    assert non_embedding(model, "baseline", qk_norm="rms_gain") == base + L * 2 * hd
    assert non_embedding(model, "nonlinear_q", qk_norm="rms_gain") == nonlinear + L * 2 * hd
    # split depth: q = x (no W_Q) in L/2 layers; above, a full-rank branch 2 C^2 + 2 C in place of W_Q
    assert non_embedding(model, "split_depth") == base - L * C * C + (L - L // 2) * (2 * C * C + 2 * C)


def test_gelu_free_ablation_has_nonlinear_qs_exact_parameters():
    """nonlinear_q_linear: the same parameter names, shapes and initial values as nonlinear_q; only act differs."""
    from study.modeling.model import GPT

    a, b = GPT(*model_and_variant("nano", "nonlinear_q"), VOCAB), GPT(*model_and_variant("nano", "nonlinear_q_linear"), VOCAB)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert isinstance(b.transformer.h[0].attn.proj["q"].act, torch.nn.Identity)
    assert isinstance(a.transformer.h[0].attn.proj["q"].act, torch.nn.GELU)


def test_split_depth_layers():
    from study.modeling.model import NonlinearProjection, GPT

    m, v = model_and_variant("cpu", "split_depth")  # 4 layers
    model = GPT(m, v, VOCAB)
    kinds = [type(b.attn.proj["q"]).__name__ for b in model.transformer.h]
    assert kinds == ["Identity", "Identity", "NonlinearProjection", "NonlinearProjection"]
    q = model.transformer.h[3].attn.proj["q"]
    assert isinstance(q, NonlinearProjection) and q.w1.weight.shape == (m.n_embd, m.n_embd)  # full rank
    assert all(b.attn.scale == pytest.approx(0.5 / (m.n_embd // m.n_head) ** 0.5) for b in model.transformer.h)


# -- the normalisations, by hand ------------------------------------------------------------------
def head_rms(t: torch.Tensor) -> torch.Tensor:
    """(..., head_dim) -> RMS over the last axis, float64 by hand."""
    return t.double().pow(2).mean(-1).sqrt()


@pytest.mark.parametrize("qk_norm, k_norm", [("rms", False), ("rms_gain", False), ("none", True)])
def test_normalised_q_and_k_have_unit_rms_per_head(qk_norm, k_norm):
    from study.modeling.model import GPT

    torch.manual_seed(0)
    m, v = model_and_variant("nano", "baseline", qk_norm=qk_norm, k_norm=k_norm)
    attn = GPT(m, v, VOCAB).transformer.h[0].attn
    x = 3.0 * torch.randn(2, 16, m.n_embd)
    q, k, _ = attn.heads(x)  # (B, n_head, T, head_dim)
    raw_q, raw_k, _ = (t.view(2, 16, m.n_head, -1).transpose(1, 2) for t in attn.qkv(x))

    def expected(raw):  # RMS of raw / sqrt(ms + 1e-6) = sqrt(ms / (ms + 1e-6)): 1 but for the eps
        ms = head_rms(raw).pow(2)
        return (ms / (ms + 1e-6)).sqrt()

    torch.testing.assert_close(head_rms(k), expected(raw_k), rtol=0, atol=1e-6)
    assert (head_rms(k) - 1).abs().max() < 1e-4
    if qk_norm == "none":
        torch.testing.assert_close(q, raw_q)  # the query is left alone
    else:
        torch.testing.assert_close(head_rms(q), expected(raw_q), rtol=0, atol=1e-6)
        assert (head_rms(q) - 1).abs().max() < 1e-4
    if qk_norm == "rms_gain":  # the gain multiplies the unit-RMS vector, element by element
        with torch.no_grad():
            attn.q_norm.weight.copy_(torch.linspace(0.5, 2.0, attn.head_dim))
        q2, _, _ = attn.heads(x)
        torch.testing.assert_close(q2, q * torch.linspace(0.5, 2.0, attn.head_dim))


def test_per_head_query_against_a_hand_computation():
    """q_h = RMS(x_h) + g_h * RMS(u_h), u = W2 GELU(W1 RMSNorm(x)), on C = 8, 2 heads, in float64 by hand."""
    from study.modeling.model import NonlinearProjection

    torch.manual_seed(3)
    C, H, r = 8, 2, 4
    proj = NonlinearProjection(C, r, "gelu", True, n_head=H).double()
    with torch.no_grad():
        for p in proj.parameters():
            p.copy_(torch.randn_like(p))  # gains too: nothing left at its default
    x = torch.randn(3, 5, C, dtype=torch.float64)
    n = proj.rms.weight * x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()  # RMSNorm, eps 1e-5
    a = n @ proj.w1.weight.T
    u = (0.5 * a * (1 + torch.erf(a / 2 ** 0.5))) @ proj.w2.weight.T  # exact GELU
    xh, uh = x.view(3, 5, H, C // H), u.view(3, 5, H, C // H)
    unit = lambda t: t / (t.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()  # noqa: E731
    want = (unit(xh) + proj.ln.weight.view(H, C // H) * unit(uh)).view(3, 5, C)
    torch.testing.assert_close(proj(x), want)


def test_per_head_arm_normalises_its_keys_and_scales_by_one():
    from study.modeling.model import GPT, NonlinearProjection

    m, v = model_and_variant("nano", "nonlinear_q_ph")
    attn = GPT(m, v, VOCAB).transformer.h[1].attn
    assert isinstance(attn.proj["q"], NonlinearProjection) and attn.proj["q"].n_head == m.n_head
    assert attn.q_norm is None and attn.k_norm is not None and attn.k_norm.weight is None
    assert attn.scale == pytest.approx(1 / (m.n_embd // m.n_head) ** 0.5)


# -- every new parameter learns ----------------------------------------------------------------------
@pytest.mark.parametrize("variant, over", [("baseline", {"qk_norm": "rms_gain"}), ("nonlinear_q_ph", {}),
                                           ("nonlinear_q_linear", {}), ("split_depth", {}),
                                           ("nonlinear_q_qknorm", {"qk_norm": "rms_gain"})])
def test_every_parameter_receives_a_gradient(variant, over):
    from study.modeling.model import GPT

    torch.manual_seed(0)
    m, v = model_and_variant("nano", variant, **over)
    model = GPT(m, v, VOCAB)
    idx = torch.randint(0, VOCAB, (2, m.block_size))
    model(idx, torch.randint(0, VOCAB, (2, m.block_size)))[1].backward()
    none = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert none == []
    if over.get("qk_norm") == "rms_gain":
        assert model.transformer.h[0].attn.q_norm.weight.grad.abs().sum() > 0


# -- schedules ----------------------------------------------------------------------------------------
def schedule_cfg(schedule: str, **train) -> RunConfig:
    return nano_run_config("baseline", schedule=schedule, batch_tokens=256, tokens=256 * 20, warmup_tokens=256 * 4,
                           lr=1e-2, min_lr=1e-3, **train)


def test_d2z_decays_linearly_to_exactly_zero():
    from study.modeling.lr_schedule import schedule_of

    cfg = schedule_cfg("d2z")  # 20 steps, 4 warmup
    lrs = [schedule_of(cfg)(s) for s in range(21)]
    assert lrs[:4] == pytest.approx([1e-2 * (s + 1) / 5 for s in range(4)])
    assert lrs[4] == pytest.approx(1e-2)
    assert lrs[20] == 0.0 and lrs[19] == pytest.approx(1e-2 / 16)  # zero at the end of the budget
    steps = [lrs[s] - lrs[s + 1] for s in range(4, 20)]
    assert steps == pytest.approx([1e-2 / 16] * 16)  # linear


def test_wsd_holds_then_decays_to_zero():
    from study.modeling.lr_schedule import schedule_of

    cfg = schedule_cfg("wsd", decay_fraction=0.25)  # 20 steps: warmup 4, stable to 15, decay over the last 5
    lrs = [schedule_of(cfg)(s) for s in range(21)]
    assert lrs[4:15] == [1e-2] * 11
    assert lrs[15:] == pytest.approx([1e-2 * k / 5 for k in (5, 4, 3, 2, 1, 0)])
    assert lrs[20] == 0.0


def test_cosine_is_todays_schedule_and_the_module_uses_schedule_of():
    import math

    from study.modeling.lr_schedule import schedule_of
    from study.modeling.lit_module import GPTModule

    cfg = schedule_cfg("cosine")
    want = [1e-2 * (s + 1) / 5 if s < 4 else 1e-3 + 0.5 * (1 + math.cos(math.pi * (s - 4) / 16)) * 9e-3
            for s in range(20)] + [1e-3]
    assert [schedule_of(cfg)(s) for s in range(21)] == pytest.approx(want, rel=1e-12)
    module = GPTModule(schedule_cfg("d2z"))
    assert module.min_lr == 0.0 and [module.lr_at(s) for s in range(21)] == [schedule_of(module.cfg)(s) for s in range(21)]


# -- z-loss and the attention-logit probe -------------------------------------------------------------
def test_z_loss_against_a_direct_logsumexp():
    from types import SimpleNamespace

    from study.modeling.lit_module import GPTModule

    torch.manual_seed(0)
    module = GPTModule(nano_run_config("baseline", z_loss=1e-3))
    batch = torch.randint(0, 512, (2, 65))
    ce, z = module._loss(batch)
    logits, _ = module.model(batch[:, :-1])
    l64 = logits.double()
    lse = l64.max(-1).values + (l64 - l64.max(-1, keepdim=True).values).exp().sum(-1).log()  # log sum exp
    assert z.item() == pytest.approx(1e-3 * lse.pow(2).mean().item(), rel=1e-6)
    want_ce = torch.nn.functional.cross_entropy(l64.view(-1, 512), batch[:, 1:].reshape(-1)).item()
    assert ce.item() == pytest.approx(want_ce, rel=1e-6)  # the loss itself stays the plain cross-entropy
    # the objective training_step returns is their sum; z_loss is logged apart
    logged = {}
    module._trainer = SimpleNamespace(world_size=1)
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    out = module.training_step(batch, 0)
    assert out.item() == pytest.approx(ce.item() + z.item(), rel=1e-6) and logged["z_loss"] == pytest.approx(z.item())
    assert GPTModule(nano_run_config("baseline"))._loss(batch)[1] is None  # off: no term at all


@pytest.mark.parametrize("variant, over", [("baseline", {}), ("nonlinear_q", {"qk_norm": "rms_gain"}),
                                           ("nonlinear_q_ph", {})])
def test_attn_logit_max_against_an_explicit_score_matrix(variant, over):
    import math

    from study.modeling.diagnostics import diagnostics
    from study.modeling.model import GPT

    torch.manual_seed(1)
    m, v = model_and_variant("nano", variant, **over)
    model = GPT(m, v, VOCAB, init_seed=5)
    for name, p in model.named_parameters():  # gains away from 1, so that a missed gain shows
        if name.endswith("norm.weight"):
            with torch.no_grad():
                p.copy_(torch.rand_like(p) + 0.5)
    idx = torch.randint(0, VOCAB, (2, 24))
    got = diagnostics(model, idx)
    H, hd, T = m.n_head, m.n_embd // m.n_head, 24
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T))
    for i, block in enumerate(model.transformer.h):
        attn = block.attn
        h = block.ln_1(x)
        q, k, _ = attn.qkv(h)  # (B, T, C): the projections themselves are tested elsewhere
        q, k = q.double().view(2, T, H, hd), k.double().view(2, T, H, hd)
        if attn.q_norm is not None:
            g = attn.q_norm.weight.double() if attn.q_norm.weight is not None else 1.0
            q = q / (q.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * g
        if attn.k_norm is not None:
            g = attn.k_norm.weight.double() if attn.k_norm.weight is not None else 1.0
            k = k / (k.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * g
        scale = (1.0 if variant == "baseline" or variant == "nonlinear_q_ph" else 0.5) / math.sqrt(hd)
        best = max(abs(float(q[b, t, n] @ k[b, s, n])) * scale
                   for b in range(2) for n in range(H) for t in range(T) for s in range(t + 1))
        assert got[f"L{i}/attn_logit_max"] == pytest.approx(best, rel=1e-5)
        x = block(x)


# -- validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("section, over, words", [
    ("variant", {"qk_norm": "layer"}, "variant.qk_norm='layer'"),
    ("variant", {"qk_norm": "rms", "k_norm": True}, "drop k_norm"),
    ("variant", {"per_head_norm": True}, "needs a residual nonlinear query"),
    ("variant", {"query": "nonlinear", "per_head_norm": True, "qk_norm": "rms"}, "k_norm=true"),
    ("variant", {"lower_query": "gelu"}, "variant.lower_query='gelu'"),
    ("variant", {"activation": "tanh"}, "variant.activation='tanh'"),
    ("train", {"schedule": "linear"}, "train.schedule='linear'"),
    ("train", {"schedule": "wsd", "decay_fraction": 1.0}, "inside the"),
    ("train", {"decay_fraction": 0.0}, "train.decay_fraction=0.0"),
    ("train", {"z_loss": -1e-4}, "train.z_loss=-0.0001"),
])
def test_recipe_mistakes_are_one_line_errors(section, over, words):
    from study.config import ConfigError, validate

    cfg = OmegaConf.structured(RunConfig)
    validate(cfg)  # the schema's defaults pass
    for k, x in over.items():
        cfg[section][k] = x
    with pytest.raises(ConfigError, match=__import__("re").escape(words)) as e:
        validate(cfg)
    assert "\n" not in str(e.value)


def test_min_lr_with_a_schedule_to_zero_is_refused():
    from study.config import ConfigError, validate

    cfg = OmegaConf.structured(RunConfig)
    cfg.train.schedule, cfg.arm.min_lr = "d2z", 1e-4
    with pytest.raises(ConfigError, match="decays to zero"):
        validate(cfg)


def test_every_arm_composes_and_validates():
    from study.config import load_config

    root = CONF.parent
    for arm in ("baseline_qknorm", "nonlinear_q_qknorm", "nonlinear_q_ph", "nonlinear_q_linear", "split_depth"):
        cfg = load_config([f"variant={arm}"], root)
        assert cfg.variant.name == arm and cfg.variant.description


# -- end to end: a run records the probe, the schedule and the z-loss --------------------------------
@pytest.mark.slow  # nano trainings
def test_a_recipe_run_records_logits_schedule_and_z_loss(run_in, tmp_path):
    """nonlinear_q_ph with d2z and z-loss on the nano data: curve.csv has attn_logit_max per layer and
    ends at lr 0, record.json holds the last row's values, MLflow has diag/... and z_loss apart."""
    import csv
    import json

    from mlflow import MlflowClient

    m = run_in("variant=nonlinear_q_ph", "seed=1", "train.tokens=8192", "train.eval_every=2",
               "train.schedule=d2z", "train.z_loss=1e-3", "train.log_every=1")
    assert m["status"] == "ok" and m["steps"] == 4 and m["min_lr"] == 0.0
    rows = list(csv.DictReader(open(tmp_path / "runs/nonlinear_q_ph-s1/curve.csv")))
    assert list(rows[0])[-2:] == ["attn_logit_max/L0", "attn_logit_max/L1"]
    assert [int(r["step"]) for r in rows] == [2, 4] and float(rows[-1]["lr"]) == 0.0
    record = json.loads((tmp_path / "runs/nonlinear_q_ph-s1/record.json").read_text())
    assert record["attn_logit_max"] == pytest.approx([float(rows[-1][f"attn_logit_max/L{i}"]) for i in (0, 1)],
                                                     abs=1e-6)
    # q_h and k_h of unit RMS, scale 1/sqrt(hd): |q.k| x scale <= sqrt(hd) (Cauchy-Schwarz), here ~ a few
    assert all(0 < x <= 16 ** 0.5 * 2.1 for x in record["attn_logit_max"])  # q_h RMS <= 1 + max g, g ~ 1
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(m["mlflow_run_id"])
    assert run.data.metrics["diag/L1/attn_logit_max"] == pytest.approx(record["attn_logit_max"][1], rel=1e-6)
    z = client.get_metric_history(m["mlflow_run_id"], "z_loss")
    assert z and all(0 < h.value < 1e-3 * 100 for h in z)  # 1e-3 x lse^2, lse ~ ln 512 = 6.2 at the start
    assert run.data.params["train.schedule"] == "d2z" and run.data.params["variant.per_head_norm"] == "True"


def test_the_report_lists_final_attention_logits(nano_project, tmp_path, monkeypatch):
    """record.json's attn_logit_max -> summary.json (mean over seeds, per layer) -> comparison.md's table."""
    import json

    from study.compare import main
    from tests.synthetic_runs import arms_overrides, write_arms

    logits = {"baseline": [[4.0, 9.0], [6.0, 11.0]], "baseline_qknorm": [[2.0, 3.0], [2.5, 3.5]]}
    seeds = (1, 2, 3, 4, 5)
    write_arms(tmp_path / "runs", {a: {s: {"loss": 3.0 + 0.01 * s, "results": {"attn_logit_max": x[s % 2]}} for s in seeds}
                                   for a, x in logits.items()})
    monkeypatch.chdir(nano_project)
    assert main(arms_overrides(tmp_path, tuple(logits))) == 0
    summary = json.loads((tmp_path / "reports/summary.json").read_text())
    assert summary["attn_logit_max"]["baseline"] == pytest.approx([5.2, 10.2])  # 3 seeds at [6, 11], 2 at [4, 9]
    assert summary["attn_logit_max"]["baseline_qknorm"] == pytest.approx([2.3, 3.3])
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "## Attention logits" in md and "| baseline | 5.20 | 10.20 | 10.20 |" in md
    assert "| baseline_qknorm | 2.30 | 3.30 | 3.30 |" in md


@pytest.mark.slow  # the throughput loops
def test_bench_measures_the_recipe_arms_beside_baseline(nano_project, monkeypatch, capsys):
    """`python -m study.bench` takes every new arm beside baseline and nonlinear_q in one run (medians of
    repeats) and prints QK-norm's cost; speed itself is never asserted."""
    import re

    from study.bench import main

    monkeypatch.chdir(nano_project)
    arms = ["baseline", "nonlinear_q", "baseline_qknorm", "nonlinear_q_qknorm", "nonlinear_q_ph",
            "nonlinear_q_linear", "split_depth"]
    assert main(["--quick", "--steps", "1", "--repeats", "2", "--variants", ",".join(arms), "model=nano"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^(\S+)\s+32-true\s+eager\s+plain", out, flags=re.M) == arms
    for arm in ("baseline_qknorm", "nonlinear_q_qknorm"):
        assert re.search(rf"^qk-norm cost {arm}\s+[\d.]+ of {arm.removesuffix('_qknorm')}'s tokens/s", out, flags=re.M)


def test_wsd_inside_the_warmup_is_refused_once_tokens_per_param_sets_the_tokens():
    """QA: validate() skips the wsd check under train.tokens_per_param (the tokens are not known yet), and the run
    then trained with a decay that started inside the warmup (its lr never reached the peak); the check runs
    again when study.runner.spec.run_spec derives train.tokens, before anything is written."""
    from study.config import ConfigError, load_config
    from study.runner.spec import run_spec

    over = ["model=nano", "data.tokenizer=bpe", "data.vocab_size=512", "variant=baseline", "train.tokens=20480",
            "train.batch_tokens=2048", "train.warmup_tokens=4096", "train.tokens_per_param=0.5", "train.schedule=wsd"]
    cfg = load_config([*over, "train.decay_fraction=1.0"], CONF.parent)  # passes: the tokens are not known
    with pytest.raises(ConfigError, match=r"of 6 steps \(train.tokens_per_param=0.5; train.decay_fraction=1.0\)"):
        run_spec(cfg, CONF.parent)
    assert run_spec(load_config(over, CONF.parent), CONF.parent).tokens == 6 * 2048
