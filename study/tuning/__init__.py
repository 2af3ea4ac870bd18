"""Tuning by one rule, every part of it (``make tune``; the stage ``python -m study.tune``; docs/verdict.md):

  rule.py        the rule itself, pure: the x2 lr grid, its extension until bracketed, lr* (quadratic vertex or best)
  search.py      one arm tuned: its grid's runs trained or reused through the launcher, tuning.json written
  table.py       the tuning table (table.json, table.md, tuning.png) and conf/tuned.yaml written together, checked
  tuned_file.py  conf/tuned.yaml's text: each arm's lr* with the recipe it was tuned at, the ladder's per-size lr*
  ladder.py      the scale ladder's lr transfer, checked at one size (``--ladder MODEL``)

Above orchestration (it sends runs out through :mod:`study.orchestration.losses`), below the stages.
"""
