"""The checks of the decided verdict's keys (docs/verdict.md): the arms in use, the tuning grid and seeds, Stein's
first stage, the comparisons of study.pairs, the margins.  Each raises ConfigError in one line that names the fix."""
from __future__ import annotations

from .schema import ConfigError, RunConfig


def used_arms(cfg: RunConfig) -> list[str]:
    """The arms the tuning and test stages and the decomposition name (in that order, each once)."""
    d = cfg.decomposition
    names = [*cfg.tune.arms, *cfg.study.arms, *cfg.study.references, *d.rows,
             *([x for x in (d.start, d.end, d.linear) if x] if d.rows else []), *d.family, *d.worth]
    return list(dict.fromkeys(str(a) for a in names))


def _pair_shapes(s) -> list[tuple[str, str]]:
    """study.pairs as (arm, reference) tuples, each entry a list of two different names; raises ConfigError."""
    from omegaconf import OmegaConf

    out = []
    for pair in s.pairs:
        raw = OmegaConf.to_container(pair) if OmegaConf.is_config(pair) else pair
        if (not isinstance(raw, (list, tuple)) or len(raw) != 2 or not all(isinstance(x, str) and x for x in raw)
                or raw[0] == raw[1]):
            raise ConfigError(f"study.pairs entry {raw!r} must be [arm, reference], two different arm names, e.g. "
                              f"study.pairs=[[nonlinear_q,baseline]]")
        out.append((raw[0], raw[1]))
    return out


def _validate_pairs(s, defined) -> None:
    """study.pairs: each an [arm, reference] of two different arms of study.arms, the second a reference, each once."""
    seen = set()
    for a, r in _pair_shapes(s):
        for name, key, names in ((a, "study.arms", s.arms), (r, "study.references", s.references)):
            if name not in names:
                raise ConfigError(f"study.pairs entry [{a}, {r}]: {name!r} is not in {key}={list(names)}: add it there"
                                  f"{'' if name in defined else f' (and define arms.{name})'}, change the pair, or "
                                  f"study.pairs=[] to compare every arm not in study.references with each reference")
        if (a, r) in seen:
            raise ConfigError(f"study.pairs lists [{a}, {r}] more than once: name each comparison once")
        seen.add((a, r))


def check_seed_roles(cfg: RunConfig) -> None:
    """Each seed serves one purpose: tuning seeds (at least 2, distinct), test seeds (study.seeds) and pilot seeds
    (study.pilot_seeds, the seeds a choice of the default was measured on) share none.

    Raises:
        ConfigError: one line naming the two lists and the seeds they share, or the tuning seeds at fault.
    """
    s, tu = cfg.study, cfg.tune
    for (a, xs), (b, ys) in ((("tune.seeds", tu.seeds), ("study.seeds", s.seeds)),
                             (("study.pilot_seeds", s.pilot_seeds), ("tune.seeds", tu.seeds)),
                             (("study.pilot_seeds", s.pilot_seeds), ("study.seeds", s.seeds))):
        shared = sorted(set(xs) & set(ys))
        if shared:
            raise ConfigError(f"{a}={list(xs)} and {b}={list(ys)} share {shared}: a seed that picks a learning rate, "
                              f"tests it or chose the default serves that purpose alone; choose disjoint seeds, e.g. "
                              f"tune.seeds=[101,102]")
    if len(set(tu.seeds)) < 2 or len(set(tu.seeds)) != len(tu.seeds):
        raise ConfigError(f"tune.seeds={list(tu.seeds)} must hold at least 2 distinct seeds (a grid point's mean "
                          f"needs two), e.g. tune.seeds=[101,102]")


def validate_verdict(cfg: RunConfig) -> None:
    """The decided verdict's keys (docs/verdict.md): tuning seeds disjoint from test seeds, a grid that
    can bracket, arms that exist, Stein's first stage of at least 5 seeds, positive margins."""
    s, tu = cfg.study, cfg.tune
    check_seed_roles(cfg)
    if not tu.centre > 0 or tu.points < 1 or tu.max_points < 3 or tu.points > tu.max_points:
        raise ConfigError(f"tune.centre={tu.centre}, tune.points={tu.points}, tune.max_points={tu.max_points}: use "
                          f"centre > 0 and 1 <= points <= max_points, max_points >= 3 (a bracket has 3 points)")
    if tu.rule not in ("vertex", "best"):
        raise ConfigError(f"tune.rule={tu.rule!r}: choose vertex (the quadratic's lr*, where defined) or best "
                          f"(the best grid point)")
    if tu.tokens is not None and (tu.tokens < cfg.train.batch_tokens or tu.tokens % cfg.train.batch_tokens):
        raise ConfigError(f"tune.tokens={tu.tokens} must be a positive multiple of train.batch_tokens="
                          f"{cfg.train.batch_tokens} (or null for train.tokens)")
    for name in used_arms(cfg):
        if "/" in str(name) or "\\" in str(name) or str(name) in (".", ".."):  # an arm is a folder: runs/test/ARM
            raise ConfigError(f"arm name {name!r} is not one folder name (its runs go to runs/test/ARM/ and its "
                              f"metric to reports/metrics/ARM.json): rename it without '/' or '\\'")
        if name not in cfg.arms:
            raise ConfigError(f"arm {name!r} (named in tune.arms, study.arms, study.references or decomposition) is "
                              f"not defined: add arms.{name} (variant, overrides, lr) to conf/study.yaml, or choose "
                              f"one of {sorted(cfg.arms)}")
    for name, arm in cfg.arms.items():
        if arm.lr is not None and not arm.lr > 0:
            raise ConfigError(f"arms.{name}.lr={arm.lr} must be > 0 (or null: tuned by make tune)")
    fixed = [a for a in tu.arms if cfg.arms[a].lr is not None]
    if fixed:
        raise ConfigError(f"tune.arms lists {fixed}, whose arms.NAME.lr is fixed: remove them from tune.arms, or set "
                          f"their lr to null to tune them")
    for name, lr in cfg.tuned.lr.items():
        if not lr > 0:
            raise ConfigError(f"tuned.lr.{name}={lr} in conf/tuned.yaml must be > 0: re-run `make tune`")
    if not s.jobs >= 1:
        raise ConfigError(f"study.jobs={s.jobs} must be >= 1 (trainings the tune, test_runs and scale_ladder stages run at once)")
    if s.jobs > 1 and not cfg.trainer.threads:
        raise ConfigError(f"study.jobs={s.jobs} runs {s.jobs} trainings at once: set trainer.threads (e.g. "
                          f"trainer.threads=1) so that each has its own cores and the numbers do not depend on jobs")
    for key, names in (("study.arms", s.arms), ("study.references", s.references), ("tune.arms", tu.arms)):
        twice = sorted({n for n in names if list(names).count(n) > 1})
        if twice:
            raise ConfigError(f"{key} lists {twice} more than once: name each arm once")
    if s.arms:
        _validate_tested(cfg)
    else:
        _pair_shapes(s)


def _validate_tested(cfg: RunConfig) -> None:
    """The test stage's keys where study.arms is set (:func:`validate_verdict`): Stein's first stage of at least 5
    seeds, references among the arms, well-formed pairs, positive margins, a target half-width within the margin."""
    s = cfg.study
    if len(s.seeds) < 5:
        raise ConfigError(f"study.seeds={list(s.seeds)} has {len(s.seeds)} seed(s): Stein's first stage needs at "
                          f"least 5 test seeds, e.g. study.seeds=[1,2,3,4,5]")
    if s.max_seeds < len(s.seeds):
        raise ConfigError(f"study.max_seeds={s.max_seeds} is below the {len(s.seeds)} first-stage seeds of "
                          f"study.seeds: raise it")
    if not s.references or any(r not in s.arms for r in s.references):
        raise ConfigError(f"study.references={list(s.references)} must be arms of study.arms={list(s.arms)} (at "
                          f"least one): add them to study.arms, or drop them from study.references and study.pairs")
    _validate_pairs(s, cfg.arms)
    d = cfg.decomposition
    for key, names in (("decomposition.family", d.family), ("decomposition.worth", d.worth)):
        missing = [n for n in names if n not in s.arms]
        if missing:
            raise ConfigError(f"{key} names {missing}, which study.arms={list(s.arms)} does not test: add them to "
                              f"study.arms, or drop them from {key}")
    if d.worth and not d.family:
        raise ConfigError(f"decomposition.worth={list(d.worth)} needs a frontier to price them on: set "
                          f"decomposition.family to the baseline family's arms (at least 3 sizes), e.g. "
                          f"decomposition.family=[baseline_mlp3.5,baseline,baseline_mlp4.75]")
    for key in ("target_halfwidth", "equivalence_margin"):
        if not getattr(s, key) > 0:
            raise ConfigError(f"study.{key}={getattr(s, key)} must be > 0 (% log-loss)")
    # Stein's N makes the 95% interval's half-width d = target_halfwidth; an interval wider than the +-margin band
    # can never lie inside it, so no comparison could be called equivalent: the seeds would answer nothing
    if s.target_halfwidth > s.equivalence_margin:
        raise ConfigError(f"study.target_halfwidth={s.target_halfwidth} is above study.equivalence_margin="
                          f"{s.equivalence_margin} (% log-loss): an interval that wide never lies inside +-margin, so "
                          f"no comparison could be decided equivalent; use at most the margin, e.g. "
                          f"study.target_halfwidth={s.equivalence_margin / 2:g} (half of it, the default's ratio)")
