"""The tasks (study/tasks/): BERT's masking proportions, masks identical across arms and seeds, the bidirectional
mask against an explicit score matrix, the MQAR generator against Zoology's hand-built example, the query-position
loss against a hand loop, the output-projection arm's parameter count, and one nano run per task in its own folder
and MLflow experiment.  Expected values are computed here, independently of the code under test."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import ROOT
from omegaconf import OmegaConf
from study.config import ConfigError, ModelConfig, VariantConfig, load_config
from study.modeling.accounting import describe
from study.modeling.model import GPT
from study.tasks import IGNORE, get_task, scored
from study.tasks import mlm, mqar

@pytest.fixture(scope="module")
def nano_project(tmp_path_factory):
    """The nano study's project with its token data prepared (as conftest's, with a longer allowance for a busy
    machine)."""
    from tests.conftest import copy_project, run_cli

    project = copy_project(tmp_path_factory.mktemp("tasks_project"))
    r = run_cli(project, "study.prepare", timeout=3000)
    assert r.returncode == 0, r.stderr[-3000:]
    return project


# run_in: conftest's fixture, on this module's nano_project above (pytest resolves it per test module)


NANO = ModelConfig(name="nano", n_layer=2, n_head=2, n_embd=32, block_size=16)
VOCAB = 64  # embedding rows of NANO here (tokens)


# -- mlm: BERT's masking -----------------------------------------------------------------------------------
def test_masking_proportions_over_many_draws():
    """15% of each window chosen (round(0.15 T), no position twice), of those 80% -> mask, 10% -> random, 10% kept,
    every position equally likely; targets the original token at chosen positions, IGNORE elsewhere."""
    T, vocab, mask, n = 100, 1000, 1000, 2000
    tokens = torch.full((T,), 7, dtype=torch.int64)  # a constant window: a kept token is told from a replaced one
    per_position = torch.zeros(T)
    masked = rnd = kept = 0
    for i in range(n):
        inputs, targets = mlm.mask_window(tokens, f"t/{i}", vocab, mask)
        chosen = targets != IGNORE
        assert int(chosen.sum()) == 15
        assert torch.equal(targets[chosen], tokens[chosen]) and torch.equal(inputs[~chosen], tokens[~chosen])
        per_position += chosen
        x = inputs[chosen]
        masked += int((x == mask).sum())
        kept += int((x == 7).sum())
        rnd += int(((x != mask) & (x != 7)).sum())
        assert int(x.max()) <= mask and (x[x != mask] < vocab).all()
    total = 15 * n  # 30,000 chosen tokens: binomial sd of a share p is sqrt(p (1 - p) / 30000) <= 0.0029
    assert abs(masked / total - 0.8) < 0.01
    assert abs(rnd / total - 0.1 * (1 - 1 / vocab)) < 0.008  # a random draw of 7 reads as kept
    assert abs(kept / total - (0.1 + 0.1 / vocab)) < 0.008
    share = per_position / n  # (T,): each position chosen with probability 0.15, sd 0.008 over 2000 windows
    assert abs(float(share.mean()) - 0.15) < 1e-6 and float((share - 0.15).abs().max()) < 0.035


def test_the_same_key_gives_the_same_mask_and_another_key_another():
    tokens = torch.arange(50)
    a, b = mlm.mask_window(tokens, "k", 50, 50), mlm.mask_window(tokens, "k", 50, 50)
    c = mlm.mask_window(tokens, "other", 50, 50)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def _mlm_module(nano_project, *overrides):
    from study.config import run_seeds
    from study.data.records import read_meta

    cfg = load_config(["task=mlm", *overrides], nano_project)
    meta = read_meta(nano_project / cfg.data.dir)
    n_val = cfg.train.val_tokens // cfg.model.block_size
    dm = mlm.datamodule(cfg, nano_project, meta, 8, run_seeds(cfg)[0], n_val, 8, 8)
    return cfg, meta, dm


def test_masks_are_identical_across_arms_and_seeds(nano_project, monkeypatch):
    """Validation: one set of masks for every variant and seed.  Training: the same masked windows for every arm of
    a seed (they depend on the data seed and the window only), other masks under another data seed."""
    monkeypatch.chdir(nano_project)
    runs = [_mlm_module(nano_project, f"variant={v}", f"seed={s}") for v in ("baseline", "nonlinear_q") for s in (1, 2)]
    vals = [dm.val_dataloader().dataset.tensors for _, _, dm in runs]
    for other in vals[1:]:
        assert all(torch.equal(x, y) for x, y in zip(vals[0], other))
    inputs, targets, _ = vals[0]
    assert (inputs == mlm.mask_id(runs[0][1])).any()  # the mask token is used ...
    assert int((targets != IGNORE).sum()) == round(0.15 * inputs.shape[1]) * inputs.shape[0]  # ... 15% chosen

    def first_batch(dm):
        return next(iter(dm.train_dataloader()))
    b1, b1_arm, b2 = first_batch(runs[0][2]), first_batch(runs[2][2]), first_batch(runs[1][2])  # s1, s1 other arm, s2
    assert torch.equal(b1[0], b1_arm[0]) and torch.equal(b1[1], b1_arm[1])
    assert not torch.equal(b1[1], b2[1])
    # a training window's mask is its own: the window at the same index read outside the loader masks the same
    cfg, meta, dm = runs[0]
    sampler = dm.train_dataloader().batch_sampler
    i = next(iter(sampler))[0]
    ds = dm.train_dataloader().dataset
    assert torch.equal(ds[i][1], b1[1][0])


def test_mlm_yardstick_is_the_unigram_cross_entropy_of_the_chosen_tokens(nano_project, monkeypatch):
    """Recomputed here from the token stream read through litdata, window by window."""
    from litdata import StreamingDataset, TokensLoader

    monkeypatch.chdir(nano_project)
    cfg, meta, dm = _mlm_module(nano_project)
    y = mlm.yardsticks(cfg, nano_project, meta)
    V, k = meta["vocab_size"], y["k"]
    split = nano_project / cfg.data.dir / "train"
    ds = StreamingDataset(str(split), item_loader=TokensLoader(block_size=1), shuffle=False)  # token by token
    stream = np.concatenate([np.asarray(ds[j]) for j in range(len(ds))])
    assert len(stream) == meta["tokens"]["train"]
    counts, total = np.bincount(stream, minlength=V).astype(float), len(stream)
    _, targets, _ = dm.val_dataloader().dataset.tensors
    t = targets[targets != IGNORE].numpy()
    want = -np.mean(np.log((counts[t] + k) / (total + k * V)))
    assert y["unigram"] == pytest.approx(want, abs=1e-6)
    assert y["chosen_tokens"] == len(t)


# -- the bidirectional mask ----------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_attention_against_an_explicit_score_matrix(causal):
    """One attention layer written out: scores q k^T x scale, -inf where t may not see s (s > t when causal; nowhere
    when bidirectional), softmax over s, times v, heads merged, output projection."""
    model = GPT(NANO, VariantConfig(), VOCAB, init_seed=3, causal=causal).eval()
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 9, NANO.n_embd, generator=torch.Generator().manual_seed(0))
    q, k, v = attn.heads(x)  # (B, n_head, T, hd) each
    B, H, T, hd = q.shape
    y = torch.zeros(B, H, T, hd)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                s_max = t + 1 if causal else T
                w = torch.tensor([float(q[b, h, t] @ k[b, h, s]) * attn.scale for s in range(s_max)]).softmax(0)
                y[b, h, t] = sum(w[s] * v[b, h, s] for s in range(s_max))
    want = attn.c_proj(y.transpose(1, 2).reshape(B, T, NANO.n_embd))  # (B, H, T, hd) -> (B, T, H, hd) -> (B, T, C)
    with torch.no_grad():
        assert torch.allclose(attn(x), want, atol=1e-5)


def test_an_encoder_sees_the_future_and_a_decoder_does_not():
    idx = torch.randint(64, (1, 12), generator=torch.Generator().manual_seed(1))
    later = idx.clone()
    later[0, -1] = (later[0, -1] + 1) % 64
    for causal in (True, False):
        model = GPT(NANO, VariantConfig(), VOCAB, init_seed=3, causal=causal).eval()
        with torch.no_grad():
            a, b = model(idx)[0], model(later)[0]
        assert torch.equal(a[0, :-1], b[0, :-1]) == causal  # positions before the changed token
    # the same weights either way: the mask is the task's, not a parameter
    sd = [GPT(NANO, VariantConfig(), VOCAB, init_seed=3, causal=c).state_dict() for c in (True, False)]
    assert all(torch.equal(sd[0][n], sd[1][n]) for n in sd[0])


# -- mqar: Zoology's generator ----------------------------------------------------------------------------------
class _Draws:
    """A stand-in numpy Generator that returns given uniform draws, in order."""

    def __init__(self, *arrays):
        self.arrays = list(arrays)

    def random(self, shape):
        a = np.asarray(self.arrays.pop(0), dtype=float)
        assert a.shape == tuple(shape)
        return a


def test_mqar_generator_builds_zoologys_hand_made_example():
    """Zoology's docstring example: vocab 12, 2 pairs, length 16, no random filler::

        Inputs: 2     8    4    7    0    0    4    0    0    0    0    0    2    0    0   0
        Labels: -100 -100 -100 -100 -100 -100  7    -100 -100 -100 -100 -100 8    -100 -100 -100

    Keys come from [1, 6) as 1 + the argsort of the key draws, values from [6, 12) as 6 + that of the value draws;
    gap g (1-based, weight a g^(a-1), a = 0.01) puts its key at position 4 + 2 (g - 1): key 2 at g = 5, key 4 at g = 2.
    """
    draws = _Draws([[0.5, 0.1, 0.6, 0.2, 0.7]],  # argsort [1, 3, ...]: keys 2, 4
                   [[0.5, 0.2, 0.1, 0.6, 0.7, 0.8]],  # argsort [2, 1, ...]: values 8, 7
                   [[0.01, 0.9, 0.01, 0.01, 0.99, 0.01]])  # largest u^(1/w): index 4 (g = 5), then 1 (g = 2)
    inputs, targets = mqar.generate(1, 16, 12, 2, 0.01, False, draws)
    assert inputs.tolist() == [[2, 8, 4, 7, 0, 0, 4, 0, 0, 0, 0, 0, 2, 0, 0, 0]]
    want = [IGNORE] * 16
    want[6], want[12] = 7, 8
    assert targets.tolist() == [want]


def test_every_query_is_answered_by_the_value_that_followed_its_key():
    V, L, P = 64, 32, 6
    inputs, targets = mqar.generate(500, L, V, P, 0.01, True, mqar.rng("t"))
    assert inputs.shape == targets.shape == (500, L) and inputs.min() >= 0 and inputs.max() < V
    for x, y in zip(inputs, targets):
        keys, values = x[0:2 * P:2], x[1:2 * P:2]
        assert len(set(keys)) == P and all(1 <= k < V // 2 for k in keys)
        assert len(set(values)) == P and all(V // 2 <= v < V for v in values)
        queries = np.flatnonzero(y != IGNORE)
        assert len(queries) == P and queries.min() >= 2 * P and all((queries - 2 * P) % 2 == 0)
        answer = dict(zip(keys.tolist(), values.tolist()))
        assert sorted(x[queries].tolist()) == sorted(keys.tolist())  # every key queried once
        assert all(answer[int(x[t])] == int(y[t]) for t in queries)


def test_mqar_gaps_follow_the_power_law():
    """With one pair the gap's distribution is the power law itself: P(g) = g^(a-1) / sum_h h^(a-1)."""
    L, a = 12, 0.5
    _, targets = mqar.generate(40000, L, 64, 1, a, False, mqar.rng("gaps"))
    g = (np.argmax(targets != IGNORE, axis=1) - 2) // 2  # 0-based gap index
    w = np.arange(1, (L - 2) // 2 + 1) ** (a - 1.0)
    want = w / w.sum()
    got = np.bincount(g, minlength=len(w)) / len(g)
    assert np.abs(got - want).max() < 0.01  # sd of each share <= 0.0025


def test_the_test_set_is_kept_with_the_data_and_the_training_set_follows_the_data_seed(tmp_path):
    from study.tasks import task_data_dir

    cfg = load_config(["task=mqar", "model=nano", "data.tokenizer=bpe", "data.vocab_size=512", "task.test_examples=50",
                       "task.train_examples=64"])
    meta = mqar.check_data(cfg, tmp_path)
    folder = task_data_dir(cfg, tmp_path)
    assert folder.parent == tmp_path / "data" / "mqar" and meta["spec"]["test_examples"] == 50
    first = mqar.test_set(folder)
    assert cfg.task.num_kv_pairs == 4  # conf/task/mqar.yaml's default: one scored query per pair
    assert first[0].shape == (50, 64) and int((first[1] != IGNORE).sum()) == 50 * 4
    assert mqar.check_data(cfg, tmp_path) == meta and torch.equal(mqar.test_set(folder)[0], first[0])  # kept
    spec = meta["spec"]
    assert np.array_equal(mqar._from_spec(spec, 64, mqar.train_key(1))[0], mqar._from_spec(spec, 64, mqar.train_key(1))[0])
    assert not np.array_equal(mqar._from_spec(spec, 64, mqar.train_key(1))[0],
                              mqar._from_spec(spec, 64, mqar.train_key(2))[0])
    (folder / "test.npz").write_bytes((folder / "test.npz").read_bytes()[:-8] + b"corrupt!")
    with pytest.raises(Exception, match="sha256"):
        mqar.check_data(cfg, tmp_path)


def test_query_position_loss_and_accuracy_against_a_hand_loop():
    """The module's validation (val_loss, val_accuracy) and training loss are means over the query positions only."""
    from study.modeling.lit_module import GPTModule

    cfg = load_config(["task=mqar", "model=nano", "data.tokenizer=bpe", "data.vocab_size=512", "task.vocab_size=32", "task.seq_len=16",
                       "task.num_kv_pairs=3"])
    module = GPTModule(cfg, vocab_size=32).eval()
    inputs, targets = (torch.from_numpy(a) for a in mqar.generate(6, 16, 32, 3, 0.01, True, mqar.rng("h")))
    with torch.no_grad():
        logits = module.model(inputs)[0]
        module.validation_step([inputs, targets], 1)  # not the first batch: no diagnostics batch kept
        train_loss = module._loss([inputs, targets])[0]
    losses, hits = [], []
    for b in range(6):
        for t in range(16):
            if int(targets[b, t]) != IGNORE:
                row = logits[b, t].double()
                losses.append(float(torch.logsumexp(row, 0) - row[targets[b, t]]))
                hits.append(float(int(row.argmax()) == int(targets[b, t])))
    assert len(losses) == 18
    assert module.val_loss.compute().item() == pytest.approx(sum(losses) / 18, abs=1e-5)
    assert module.val_accuracy.compute().item() == pytest.approx(sum(hits) / 18, abs=1e-6)
    assert train_loss.item() == pytest.approx(sum(losses) / 18, abs=1e-5)
    loss, mask, correct = scored(logits, targets)
    assert int(mask.sum()) == 18 and float(loss[~mask].abs().sum()) == 0.0


# -- parameter counts ----------------------------------------------------------------------------------------
def test_output_projection_arm_parameter_count():
    """nonlinear_o replaces W_O (C^2) by y + LN(W2 GELU(W1 RMSNorm(y))), r = C/2: C r + r C + 2 C = C^2 + 2C, i.e.
    +2C per layer; the same per task (the task changes the embedding's rows only)."""
    cfg = load_config(["variant=nonlinear_o"])
    base = load_config([])
    C, L = cfg.model.n_embd, cfg.model.n_layer
    got = describe(cfg.model, cfg.variant, VOCAB)["non_embedding_params"]
    want_base = L * (4 * C * C + 2 * C * int(C * 4.0) + 2 * C) + C  # attn 4C^2, MLP 8C^2, two LN gains; ln_f
    assert describe(base.model, base.variant, VOCAB)["non_embedding_params"] == want_base == 197_184
    assert got == want_base + L * 2 * C == 197_696
    for name in ("nonlinear_k", "nonlinear_v", "nonlinear_q"):  # the K and V rows: the same map, the same count
        other = load_config([f"variant={name}"])
        assert describe(other.model, other.variant, VOCAB)["non_embedding_params"] == want_base + L * 2 * C
    for causal in (True, False):
        model = GPT(cfg.model, cfg.variant, VOCAB, causal=causal)
        n = sum(p.numel() for name, p in model.named_parameters() if ".attn.proj.o." in name)
        assert n == L * (C * C + 2 * C)


# -- config: one place, one line ------------------------------------------------------------------------------
def test_tasks_have_their_own_runs_experiment_and_lr():
    lm_cfg, mlm_cfg = load_config([]), load_config(["task=mlm"])
    assert (lm_cfg.study.runs_dir, lm_cfg.study.name) == ("runs", "nonlinear-queries")
    assert (mlm_cfg.study.runs_dir, mlm_cfg.study.name) == ("runs/mlm", "nonlinear-queries-mlm")
    assert (mlm_cfg.tune.runs_dir, mlm_cfg.tune.table_dir) == ("runs_tune/mlm", "conf/tuning/mlm")
    assert (lm_cfg.study.reports_dir, mlm_cfg.study.reports_dir) == ("reports", "reports/mlm")
    import yaml

    tuned = yaml.safe_load((ROOT / "conf" / "tuned.yaml").read_text())["tuned"]
    # each task at its own lr* (tuned.task.mlm, {} before mlm is tuned); lm's lr* never lent to another task
    assert dict(mlm_cfg.tuned.lr) == ((tuned.get("task") or {}).get("mlm") or {}).get("lr", {})
    assert dict(lm_cfg.tuned.lr) == tuned["lr"] and dict(mlm_cfg.tuned.lr) != dict(lm_cfg.tuned.lr)
    from study.config import resolve_task

    own = load_config(["task=mqar", "tuned.task={mqar: {lr: {baseline: 0.02}}, mlm: {lr: {baseline: 0.5}}}"])
    assert own.tuned.lr.baseline == 0.02 and dict(own.tuned.lr) == dict(own.tuned.task.mqar.lr)  # mqar's, not mlm's
    again = resolve_task(own)  # a resolved config (a run's config.json) resolves to itself; the given one is unchanged
    assert again == own and again is not own
    assert own.study.runs_dir == "runs/mqar" and own.study.name == "nonlinear-queries-mqar"


def test_the_tuned_file_keeps_each_tasks_lr_apart(tmp_path):
    """lm's lines are unchanged by the task section; a task's lr* are written and read back under tuned.task.TASK."""
    import yaml

    from study.tuning.tuned_file import read_tuned, task_section, tuned_tasks, tuned_yaml

    lm_table = {"arms": {"baseline": {"lr_star": 0.0107, "recipe": {"model": {"n_embd": 64}}}}}
    mlm_table = {"arms": {"baseline": {"lr_star": 0.02, "recipe": {"model": {"n_embd": 64}}},
                          "nonlinear_q": {"lr_star": None, "recipe": None}}}
    plain = tuned_yaml(lm_table)
    f = tmp_path / "tuned.yaml"
    f.write_text(tuned_yaml(lm_table, None, {"mlm": task_section(mlm_table)}))
    assert f.read_text().startswith(plain)  # lm's lines first, as they were
    assert tuned_tasks(f) == {"mlm": {"lr": {"baseline": 0.02}, "recipe": {"baseline": {"model": {"n_embd": 64}}}}}
    assert read_tuned(f) == {"baseline": {"lr_star": 0.0107, "recipe": {"model": {"n_embd": 64}}}}
    assert yaml.safe_load(f.read_text())["tuned"]["lr"] == {"baseline": 0.0107}


def test_a_wrong_task_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as e:
        load_config(["task=bert"])
    assert "\n" not in str(e.value) and all(t in str(e.value) for t in ("lm", "mlm", "mqar"))
    with pytest.raises(ConfigError, match="num_kv_pairs"):  # the task module's own check, in every composition
        load_config(["task=mqar", "task.num_kv_pairs=40"])
    from study.config import config_hash

    typed = load_config(["task=mqar", "task.power_a='1'"])  # typed by mqar's Settings before its check reads it
    assert typed.task.power_a == 1.0 and isinstance(typed.task.power_a, float)
    assert config_hash(typed) == config_hash(load_config(["task=mqar", "task.power_a=1.0"])) == \
        config_hash(load_config(["task=mqar", "task.power_a=1"]))
    for name, why in (("common", "is the package's own module, not a task"), ("nope", "is not a task")):
        with pytest.raises(ConfigError, match=why):
            get_task(name)
    with pytest.raises(ConfigError):
        get_task("nope")


# -- one nano run per task -------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["mlm", "mqar"])
def test_a_nano_run_per_task_in_its_own_folder_and_experiment(run_in, tmp_path, task):
    extra = ["task.test_examples=64", "task.train_examples=512", "task.seq_len=32", "task.num_kv_pairs=4"] \
        if task == "mqar" else []
    m = run_in(f"task={task}", "train.tokens=8192", "train.eval_every=2", *extra)
    d = tmp_path / "runs" / task / "baseline-s1"
    assert (d / "metrics.json").is_file() and m["task"] == task and 0.0 <= m["val_accuracy"] <= 1.0
    assert math.isfinite(m["val_loss"]) and m["val_loss"] < math.log(512 if task == "mlm" else 256) + 0.5
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    assert client.get_experiment_by_name(f"test-study-{task}") is not None
    assert "val_accuracy" in (d / "curve.csv").read_text().splitlines()[0]


def test_the_embedding_rows_come_from_the_data_vocabulary_of_each_task():
    """One vocabulary setting (data.tokenizer, data.vocab_size; mqar: task.vocab_size): lm takes the data's ids, mlm
    one more (its mask token), mqar the generator's, each rounded up to model.vocab_multiple; a run reads them from
    meta.json, the config alone (configured_rows) gives the same before data exist."""
    from study.tasks import configured_rows, lm

    lm_cfg, mlm_cfg, mqar_cfg = load_config([]), load_config(["task=mlm"]), load_config(["task=mqar"])
    assert (lm_cfg.data.tokenizer, lm_cfg.data.vocab_size) == ("bytes", None)
    assert [configured_rows(c) for c in (lm_cfg, mlm_cfg, mqar_cfg)] == [257, 258, mqar_cfg.task.vocab_size]
    assert mlm.model_vocab(mlm_cfg, {"vocab_size": 257}) == 258 and lm.model_vocab(lm_cfg, {"vocab_size": 300}) == 300
    gpt = load_config(["model=gpt3-small", "data=gpt2", "trainer=cpu"])
    assert configured_rows(gpt) == 50304 == 64 * 786  # 50257 GPT-2 ids padded to a multiple of 64
    assert configured_rows(load_config(["model=gpt3-small", "data=gpt2", "trainer=cpu", "task=mlm"])) == 50304
    bpe = load_config(["data.tokenizer=bpe", "data.vocab_size=2048", "model.vocab_multiple=3"])
    assert configured_rows(bpe) == 2049 and lm.model_vocab(bpe, {"vocab_size": 2000}) == 2001  # meta.json wins
