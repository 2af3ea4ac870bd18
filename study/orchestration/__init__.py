"""Orchestration: which runs a stage needs, reuse of finished runs, and launching the missing ones through a launcher
(``launch``: submitit's SLURM job arrays, or ``study.jobs`` processes on this machine), with one live line per stage.
Imported by the stages; imports runner/, config/ and modeling/ (counts), never a stage."""
