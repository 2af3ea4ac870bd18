"""Every reader of runs goes through this package: compare, the scale ladder's report, the notebook.

Imports flow one way, stages (compare, the notebook) -> analysis -> stats: each module
below imports only modules listed after it, and none imports a stage.
  report.py    all of it in one call: load the test runs, summarise, write comparison.md, summary.json, metrics/,
               curves.csv, figures
  figures.py   the figures (matplotlib; only those that apply are written)
  tables.py    comparison.md (markdown)
  attention_report.py  its section on attention's share, with a warning where attention carries under ten margins
  summary.py   summary.json: the verdict, yardsticks, per corpus, attention logits, lost points, the ladder
  scale_ladder.py  the scale ladder's verdict (summary.json "scale_ladder")
  verdict.py   the decided verdict of study.arms: the test runs, every comparison in one word, the decomposition
  decision.py  Stein's two-stage seed count, TOST beside the paired t test, BH over all comparisons, the words
  runs.py      load runs and the settings they recorded (run folders or the MLflow store)
  pairing.py   check that runs pair: the same settings but the variant (one-line PairingError)
  stats.py     paired t, Benjamini-Hochberg, power, frontier fits and multipliers (scipy.stats)
"""
