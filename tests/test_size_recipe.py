"""A scale ladder size's lr* carries the recipe it was tuned at (conf/tuned.yaml tuned.size_recipe): a ladder run
at another recipe is refused in one line naming the tuning command, and a corrupt tuned.size entry is refused in one
line naming the entry."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import ROOT
from study.config import ConfigError, load_config

# the sizes were tuned at learned positions (the default until 2026-12-06), which `make scale-ladder` names
LADDER = ["study.arms=[]", "scale_ladder.models=[bytes-32,bytes-48,bytes-64]",
          "task.position=learned"]
RUN = ["task.position=learned", "model=bytes-32", "variant=baseline", "train.tokens_per_param=10.64", "train.lr_from_tuned=true",
       "train.lr_per_size=true"]


def refusal(overrides: list[str], resolved: bool = False) -> str:
    """The one-line ConfigError that composing (and, ``resolved``, resolving) ``overrides`` raises."""
    from study.runner.spec import run_spec

    with pytest.raises(ConfigError) as e:
        cfg = load_config(overrides, ROOT)
        if resolved:
            run_spec(cfg, ROOT)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_committed_sizes_record_the_recipe_of_their_tuning_table():
    tuned = yaml.safe_load((ROOT / "conf" / "tuned.yaml").read_text())["tuned"]
    assert set(tuned["size_recipe"]) == set(tuned["size"]) >= {"bytes-32", "bytes-48", "bytes-64"}
    for m, lrs in tuned["size"].items():
        table = json.loads((ROOT / "conf" / "tuning" / m / "table.json").read_text())["arms"]
        for v, lr in lrs.items():
            at, row = tuned["size_recipe"][m][v], table[v]
            assert lr == row["lr_star"] and at["train"]["tokens"] == row["tokens"] == row["recipe"]["train"]["tokens"]
            assert at["model"]["n_embd"] == row["recipe"]["model"]["n_embd"]
            assert at["train"]["tokens_per_param"] == (1.0 if m.startswith("ladder-") else 10.64)
            assert at["model"]["position"] == ("rope" if m.startswith("rope-") else "learned")


def test_a_ladder_at_another_budget_is_refused_before_it_trains():
    assert load_config(LADDER, ROOT).scale_ladder.tokens_per_param == 10.64  # the budget the sizes were tuned at
    # the sizes' files name learned positions: the task's (rope) does not move them
    assert load_config(LADDER[:-1], ROOT).scale_ladder.models == ["bytes-32", "bytes-48", "bytes-64"]
    msg = refusal([*LADDER, "scale_ladder.tokens_per_param=0.2"])
    assert msg.startswith("scale_ladder.variants: 'baseline' at size bytes-32: its lr* (conf/tuned.yaml "
                          "tuned.size.bytes-32) was tuned at train.tokens_per_param=10.64, but this run trains at "
                          "train.tokens_per_param=0.2: re-tune that size at these settings (`python -m study.tune "
                          "--ladder bytes-32 scale_ladder.tokens_per_param=0.2`)")
    msg = refusal([*LADDER, "scale_ladder.warmup_tokens=131072"])
    assert "tuned at train.warmup_tokens=262144, but this run trains at train.warmup_tokens=131072" in msg
    assert "scale_ladder.warmup_tokens=131072`" in msg
    # the BPE-era ladder, reproduced as docs/history.md says, is at the recipe its sizes were tuned at
    bpe = load_config(["model=cpu-bpe2048", "data.tokenizer=bpe", "data.vocab_size=2048", LADDER[0], LADDER[2],
                       "scale_ladder.models=[ladder-64,ladder-96,ladder-128]", "scale_ladder.tokens_per_param=1.0",
                       "scale_ladder.warmup_tokens=32768"], ROOT)
    assert bpe.scale_ladder.models == ["ladder-64", "ladder-96", "ladder-128"]
    # and at bytes it is not (its lr* were tuned on BPE 2048)
    assert "tuned at data.tokenizer=bpe, data.vocab_size=2048, but this run trains at data.tokenizer=bytes, data.vocab_size=None" in refusal(
        [LADDER[0], LADDER[2], "scale_ladder.models=[ladder-64,ladder-96]", "scale_ladder.tokens_per_param=1.0",
         "scale_ladder.warmup_tokens=32768"])


def test_one_ladder_run_at_another_recipe_is_refused_once_its_tokens_are_known():
    from study.runner.spec import run_spec

    spec = run_spec(load_config(RUN, ROOT), ROOT)
    assert spec.cfg.arm.lr == spec.lr == 0.007154653871171246 and spec.lr_source == "tuned.size.bytes-32.baseline"
    assert "tuned at model.n_embd=32, model.n_head=2, but this run trains at model.n_embd=48, model.n_head=3" in \
        refusal([*RUN, "model.n_embd=48", "model.n_head=3"])
    # the tokens come from the budget rule when the run resolves: a record of other tokens is refused then
    msg = refusal([*RUN, "tuned.size_recipe.bytes-32.baseline.train.tokens=1024"], resolved=True)
    assert "tuned at train.tokens=1024, but this run trains at train.tokens=524288" in msg
    assert "`python -m study.tune --ladder bytes-32`" in msg and msg.endswith("set train.lr_from_tuned=false")


def test_a_rotary_size_is_checked_at_the_positions_its_model_file_names():
    rope = ["study.arms=[]", "scale_ladder.models=[rope-32,rope-48,rope-64]"]
    assert load_config(rope, ROOT).scale_ladder.models == ["rope-32", "rope-48", "rope-64"]  # `make scale-ladder`
    # the task's positions do not move a size whose file names its own: its lr* still applies
    assert load_config([*rope, "task.position=learned"], ROOT).task.position == "learned"
    msg = refusal([*rope, "tuned.size_recipe.rope-48.nonlinear_q.model.position=learned"])
    assert msg.startswith("scale_ladder.variants: 'nonlinear_q' at size rope-48: its lr* (conf/tuned.yaml "
                          "tuned.size.rope-48) was tuned at model.position=learned, but this run trains at "
                          "model.position=rope: train sizes whose model files name model.position=learned (rope-N: "
                          "rope, bytes-N: learned; a size without one takes task.position), without a model.position "
                          "override, or set scale_ladder.lr_per_size=false")
    # one ladder compares sizes at one kind of positions
    assert refusal(["study.arms=[]", "scale_ladder.models=[rope-32,bytes-48]"]) == (
        "scale_ladder.models=['rope-32', 'bytes-48'] train at different positions (rope-32 rope, bytes-48 learned): "
        "choose sizes of one kind (rope-N: rotary, bytes-N: learned)")
    # the default size's lr* (tuned at rope) transferred to every size: the sizes' positions are the ladder's
    assert load_config([*rope, "scale_ladder.lr_per_size=false", "task.position=learned"], ROOT)
    msg = refusal(["study.arms=[]", "scale_ladder.models=[bytes-32,bytes-48]", "scale_ladder.lr_per_size=false"])
    assert "its lr* was tuned at model.position=rope, but this run trains at model.position=learned" in msg
    assert "train sizes whose model files name model.position=rope" in msg
    assert msg.endswith(", or set scale_ladder.lr_from_tuned=false (train.lr)")  # lr_per_size is false already
    # a hand-started run of a rotary size at other positions: the same words
    msg = refusal(["model=rope-32", "model.position=learned", *RUN[2:]], resolved=True)
    assert "tuned at model.position=rope, but this run trains at model.position=learned: train sizes" in msg
    from study.runner.spec import run_spec

    tuned = yaml.safe_load((ROOT / "conf" / "tuned.yaml").read_text())["tuned"]["size"]["rope-32"]
    spec = run_spec(load_config(["model=rope-32", *RUN[2:]], ROOT), ROOT)
    assert (spec.position, spec.lr, spec.lr_source) == ("rope", tuned["baseline"], "tuned.size.rope-32.baseline")


@pytest.mark.parametrize("bad, shown", [("0", "0"), ("-0.01", "-0.01"), ("abc", "'abc'"), ("null", "null")])
def test_a_corrupt_size_lr_is_refused_in_one_line_naming_the_entry(bad, shown):
    for overrides in ([*RUN, f"tuned.size.bytes-32.baseline={bad}"],
                      [*LADDER, f"tuned.size.bytes-32.baseline={bad}"]):
        msg = refusal(overrides, resolved=True)
        assert msg.startswith(f"tuned.size.bytes-32.baseline={shown} in conf/tuned.yaml is not an lr* (a number > 0): "
                              f"re-tune that size (`python -m study.tune --ladder bytes-32`")


def test_the_tuned_file_keeps_each_size_recipe(tmp_path):
    from study.tuning.tuned_file import tuned_size_recipes, tuned_sizes, tuned_yaml

    at = {"model": {"name": "nano"}, "train": {"tokens": 2048, "tokens_per_param": 0.5}}
    f = tmp_path / "tuned.yaml"
    f.write_text(tuned_yaml({"arms": {}}, {"nano": {"baseline": 4e-3}}, None,
                            {"nano": {"baseline": at}, "gone": {"baseline": at}}))
    assert tuned_sizes(f) == {"nano": {"baseline": 4e-3}}
    assert tuned_size_recipes(f) == {"nano": {"baseline": at}}  # a recipe without its size's lr* is not kept


def test_a_ladder_size_stating_no_plain_position_is_refused_in_one_line(nano_project):
    conf = nano_project / "conf" / "model"
    (conf / "odd-32.yaml").write_text((conf / "rope-32.yaml").read_text().replace("name: rope-32", "name: odd-32")
                                      .replace("position: rope", "position: ${task.position}"))
    with pytest.raises(ConfigError) as e:
        load_config(["study.arms=[]", "scale_ladder.models=[rope-32,odd-32]"], nano_project)
    assert str(e.value) == ("conf/model/odd-32.yaml states position: ${task.position}: a scale ladder size names "
                            "learned or rope, or leaves it out to take the task's (task.position)")
