"""Which runs may be compared: those that agree on every setting but the variant.

Runs pair when their recorded settings (``run["settings"]``, see :mod:`study.analysis.runs`)
agree on everything but the variant section (its projections and widths), the arm section (its lr: arms tuned
to their own lr* differ only there) and the seed: model shape, block size, tokens, data (the
prepared-data digest), training and optimizer settings.  Runs of one seed must moreover share the
resolved data and init seeds (``train.data_seed`` / ``train.init_seed``, None = seed), so that the
pair sees the same batches from the same initialisation.
"""
from __future__ import annotations

from collections import Counter

from study.config import StudyError, own_task_fields

#: settings that may differ between paired runs: the variant itself, its arm's lr and the seed (paired by it)
VARIANT_KEYS = ("variant.", "arm.")
#: what may differ between the seeds of one variant: its arm's lr (tuned or swept) and its wording; every other
#: variant key (projections, widths, qk_norm, ...) is the variant's architecture
VARIANT_TUNING = ("arm.lr", "arm.min_lr", "variant.description")
#: the run's specification as MLflow params (study.runner.spec.RunSpec.record: name, seed, arm, lr and its source
#: ...): a summary of the config, whose own keys pair (the tokens, schedule, positions, task among them)
SPEC_PREFIX = "spec."
#: the recorded numerics (config.json's ``numerics``: CPU kernels, torch, threads; study/config/numerics.py)
NUMERICS_PREFIX = "numerics."
SEED_KEYS = ("seed", "train.data_seed", "train.init_seed")
#: how a run executes or is logged, not what it computes (also left out of the resume key,
#: study/config/naming.py); ``train.overwrite`` only let a hand-started run replace a finished one
RUNTIME_KEYS = ("trainer.progress_bar", "trainer.threads", "data.num_proc", "data.hf_cache_dir", "train.overwrite",
                "train.log_every")


class PairingError(StudyError):
    """Runs that do not pair: the message names the run and the settings that differ."""


def ignored(key: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a flat setting key is allowed to differ between paired runs."""
    return (key.startswith(VARIANT_KEYS) or key.startswith(SPEC_PREFIX) or key in SEED_KEYS or key in RUNTIME_KEYS
            or any(key == e or key.startswith(e + ".") for e in extra))


def comparable(settings: dict, extra: tuple[str, ...] = ()) -> dict:
    """The settings that must agree, as a dict (the others dropped, with the task fields the runs' task does not
    read: runs recorded before and after another task's defaults changed still pair)."""
    return {k: v for k, v in own_task_fields(settings).items() if not ignored(k, extra)}


def _fmt(v) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def seeds_of(settings: dict, seed: int) -> tuple:
    """(data seed, init seed) a run resolved: train.data_seed / train.init_seed, None = the seed."""
    data, init = settings.get("train.data_seed"), settings.get("train.init_seed")
    return (seed if data in (None, "None") else data, seed if init in (None, "None") else init)


def check(runs: dict[str, dict[int, dict]], where: str, ignore: tuple[str, ...] = ()) -> dict:
    """Check that ``runs`` ({variant: {seed: run}}) pair; return the settings they share.

    The reference is the settings most runs share (ties: the earliest run); a run that differs is
    named with every key that differs, in one line.

    Args:
        where: how the error names the group ("the study's runs", "the runs of tuned" ...).
        ignore: further keys (or key prefixes) that may differ, e.g. ("model", "train.tokens") across the scale ladder's sizes.

    Returns: the shared comparable settings (flat dict), empty when ``runs`` is.

    Raises:
        PairingError: a run differs in a setting other than the variant, or two variants of one
            seed used different data or init seeds.
    """
    flat = [(v, s, r) for v, by_seed in runs.items() for s, r in sorted(by_seed.items())]
    if not flat:
        return {}
    check_code(flat, where)
    keyed = [(v, s, r, comparable(r["settings"], ignore)) for v, s, r in flat]
    counts = Counter(tuple(sorted((k, _fmt(x)) for k, x in c.items())) for *_, c in keyed)
    top = max(counts.values())
    ref = next(c for *_, c in keyed if counts[tuple(sorted((k, _fmt(x)) for k, x in c.items()))] == top)
    ref_name = next(r["name"] for *_, r, c in keyed if c == ref)
    bad = []
    for v, s, r, c in keyed:
        keys = sorted(k for k in set(c) | set(ref) if _fmt(c.get(k)) != _fmt(ref.get(k)))
        check_numerics_agree(keys, c, ref, r["name"], ref_name, where)
        if keys:
            shown = ", ".join(f"{k} {_fmt(c.get(k))} (vs {_fmt(ref.get(k))})" for k in keys[:6])
            bad.append(f"{r['name']} differs in {shown}{' ...' if len(keys) > 6 else ''}")
    if bad:
        raise PairingError(f"{where} do not pair: {bad[0]}{f' (and {len(bad) - 1} more run(s))' if len(bad) > 1 else ''}"
                           f" from {ref_name}; runs compare only when they agree on everything but the variant: "
                           f"re-run the odd run(s) with the study's settings (`dvc repro`), or move them out of the "
                           f"study's folder")
    for v, runs_of in runs.items():  # the seeds of one variant: one architecture
        arch = [(r["name"], {k: _fmt(x) for k, x in r["settings"].items()
                             if k.startswith(VARIANT_KEYS) and k not in VARIANT_TUNING})
                for _, r in sorted(runs_of.items())]
        for name, a in arch[1:]:
            keys = sorted(k for k in set(a) | set(arch[0][1]) if a.get(k) != arch[0][1].get(k))
            if keys:
                shown = ", ".join(f"{k} {a.get(k)} (vs {arch[0][1].get(k)})" for k in keys[:6])
                raise PairingError(f"{where} do not pair: {name} differs from {arch[0][0]} in {shown}; the seeds of "
                                   f"one variant must share its architecture (only arm.lr may differ): re-run "
                                   f"the odd run with the variant's file (`dvc repro`), or move it out of the study's "
                                   f"folder")
    by_seed: dict[int, dict] = {}
    for v, s, r in flat:
        by_seed.setdefault(s, {})[v] = (seeds_of(r["settings"], s), r["name"])
    for s, found in by_seed.items():
        if len({x for x, _ in found.values()}) > 1:
            shown = ", ".join(f"{name} {x}" for x, name in found.values())
            raise PairingError(f"{where} do not pair at seed {s}: (data seed, init seed) differ: {shown}; paired runs "
                               f"must see the same batches from the same initialisation")
    return ref


def check_numerics_agree(keys: list[str], settings: dict, ref: dict, name: str, ref_name: str, where: str) -> None:
    """Refuse a run whose differing ``keys`` include its recorded numerics (another machine's kernels, torch or
    threads): such runs never pair, whatever else differs.

    Raises:
        PairingError: one line naming the run, the numerics that differ and the fix.
    """
    numerics = [k for k in keys if k.startswith(NUMERICS_PREFIX)]
    if numerics:
        shown = ", ".join(f"{k} {_fmt(settings.get(k))} (vs {_fmt(ref.get(k))})" for k in numerics[:4])
        raise PairingError(f"{where} do not pair: {name} was trained under other numerics than {ref_name} ({shown}): "
                           f"runs under different numerics never pair; re-train it under this machine's numerics "
                           f"(`dvc repro`), or compare each machine's runs apart")


def check_code(flat: list[tuple], where: str) -> None:
    """Refuse a run whose config.json records another training code than this checkout's
    (:func:`study.runfolder.digests.code_digest`): the test stage would train it again, so compare does not count it either
    (one rule for both).  A run recorded without a code digest (before it was recorded) is not checked here; it has
    no recorded numerics either, so it never pairs with a run that has.

    Raises:
        PairingError: one line naming the run, both digests and the fix.
    """
    from study.runfolder.digests import code_digest

    for _, _, r in flat:
        recorded, now = r["settings"].get("code_digest"), code_digest(r["settings"].get("task.name", "lm"))
        if recorded is not None and recorded != now:
            raise PairingError(f"{where} do not pair: {r['name']} was trained by other training code (code digest "
                               f"{recorded}, this checkout's {now}: study/modeling, data or tasks changed), so the test "
                               f"stage would train it again; re-train it here (`dvc repro`), or compare it in the "
                               f"checkout that trained it")


def shared_settings(groups: list[dict]) -> dict:
    """The settings every group of runs shares (their intersection), for the report's header."""
    if not groups:
        return {}
    out = dict(groups[0])
    for g in groups[1:]:
        out = {k: v for k, v in out.items() if k in g and _fmt(g[k]) == _fmt(v)}
    return out
